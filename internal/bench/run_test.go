package bench

import (
	"cmp"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

// target is a driver on a server.
type target struct {
	driver  string
	dialect idem.Dialect
	server  *server // nil: SQLite, in a file in a temporary directory
}

var targets = []target{
	{"pgx", idem.Postgres, postgresServer},
	{"postgres", idem.Postgres, postgresServer},
	{"mysql", idem.MariaDB, mariadbServer},
}

// open opens tg's server with the harness's pool size, skipping when
// there is none (failing instead under IDEM_TEST_REQUIRE=1, as in CI:
// server.DSN). IDEM_BENCH_DSN_PARAMS is appended to the DSN (e.g.
// "binary_parameters=yes" or "interpolateParams=true"), for measuring
// driver settings. SQLite's database is a file of tb's own, with the DSN
// settings docs/dialects.md asks for.
func (tg target) open(tb testing.TB) *sql.DB {
	tb.Helper()
	dsn := "file:" + filepath.Join(tb.TempDir(), "bench.db") + "?_txlock=immediate&_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"
	if tg.server != nil {
		dsn = withParams(tg.server.DSN(tb))
	}
	db, err := sql.Open(tg.driver, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// TestRun runs every path briefly and checks the report's shape. With
// IDEM_BENCH=1 it runs the full measurement and prints it: the same
// numbers as `idem bench`. IDEM_BENCH=16 measures concurrency 16 only,
// in 8 rounds without storms, for comparing settings quickly.
// IDEM_BENCH_ROUNDS sets the number of rounds of either, and
// IDEM_BENCH_STORM the number of requests in a storm.
func TestRun(t *testing.T) {
	mode := os.Getenv("IDEM_BENCH")
	for _, tg := range targets {
		t.Run(tg.driver, func(t *testing.T) {
			cfg := Config{DB: tg.open(t), Driver: tg.driver, Dialect: tg.dialect,
				Rounds: 1, Duration: 100 * time.Millisecond, Concurrency: []int{1, 4}, HotWorkers: 4, Storms: 1, StormRequests: 8}
			rounds, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS"))
			stormRequests, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_STORM"))
			switch mode {
			case "1":
				cfg = Config{DB: cfg.DB, Driver: tg.driver, Dialect: tg.dialect, Concurrency: []int{1, 16}, Rounds: rounds, StormRequests: stormRequests}
			case "16":
				cfg = Config{DB: cfg.DB, Driver: tg.driver, Dialect: tg.dialect, Concurrency: []int{16}, Rounds: cmp.Or(rounds, 8), Storms: -1}
			}
			var out strings.Builder
			rep, err := Run(context.Background(), cfg, &out)
			t.Log("\n" + out.String())
			if testing.Verbose() {
				for _, r := range rep.Results {
					t.Logf("%s/%d: %.0f", r.Path, r.Concurrency, r.Rates)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			// bare, floor, fresh, read, replay, cross, retry and claim at
			// each concurrency, and hot.
			if want := 8*len(cfg.Concurrency) + 1; len(rep.Results) != want {
				t.Fatalf("%d results, want %d", len(rep.Results), want)
			}
			floors := map[string]string{"fresh": "floor", "replay": "read", "cross": "read", "retry": "read", "hot": "read"}
			for _, r := range rep.Results {
				if r.TxPerSec <= 0 || r.Ratio <= 0 {
					t.Errorf("%+v: no transactions measured", r)
				}
				if r.Path == "bare" && r.Ratio != 1 {
					t.Errorf("%+v: bare's ratio to itself is not 1", r)
				}
				if r.Floor != floors[r.Path] || r.Floor != "" && (r.FloorRatio <= 0 || len(r.FloorRatios) != len(r.Ratios)) {
					t.Errorf("%+v: want a ratio to the floor %q in every round", r, floors[r.Path])
				}
			}
			if cfg.Storms < 0 {
				return
			}
			if len(rep.Storms) != 2 {
				t.Fatalf("storms %+v: want one per mode", rep.Storms)
			}
			for _, s := range rep.Storms {
				if s.P50 < s.Work || s.P99 < s.P50 {
					t.Errorf("storm %+v: a request answered before the operation ended", s)
				}
			}
		})
	}
}

// Every cell runs once a round, and after its bare run in one round and
// before it in the next, whatever the number of cells (with --concurrency
// 16 there are four).
func TestScheduleAlternates(t *testing.T) {
	for cells := 1; cells <= 9; cells++ {
		first := map[int][]bool{}
		for round := range 4 {
			for _, st := range schedule(cells, round) {
				first[st.cell] = append(first[st.cell], st.bareFirst)
			}
		}
		for j := range cells {
			if len(first[j]) != 4 {
				t.Fatalf("%d cells: cell %d ran %d times in 4 rounds", cells, j, len(first[j]))
			}
			for r := 1; r < 4; r++ {
				if first[j][r] == first[j][r-1] {
					t.Errorf("%d cells: cell %d has its bare run on the same side in rounds %d and %d", cells, j, r-1, r)
				}
			}
		}
	}
}

// A run shorter than a transaction still runs one per worker, so that no
// rate is 0 and no ratio NaN (--duration 1us printed NaN and +Inf).
func TestMeasureRunsOncePerWorker(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/bench.db?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e, err := Setup(ctx, db, idem.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	rate, err := measure(ctx, e, paths[0], 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.Orders(ctx, "bare"); err != nil || n != 3 || rate <= 0 {
		t.Errorf("a run of 0s: rate %v, %d order rows (%v), want 3 rows, one per worker", rate, n, err)
	}
}

// withParams appends $IDEM_BENCH_DSN_PARAMS, if set, to dsn's parameters:
// driver settings to measure (see docs/benchmarks.md).
func withParams(dsn string) string {
	p := os.Getenv("IDEM_BENCH_DSN_PARAMS")
	if p == "" {
		return dsn
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + p
	}
	return dsn + "?" + p
}
