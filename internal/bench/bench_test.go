package bench

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

// seeded sets up a run's tables on db, closed when tb ends, with the keys
// that replays and reads use completed for workers workers (Env.Seed).
func seeded(tb testing.TB, db *sql.DB, d idem.Dialect, workers int) *Env {
	tb.Helper()
	ctx := context.Background()
	e, err := Setup(ctx, db, d)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close(ctx) })
	if err := e.Seed(ctx, workers); err != nil {
		tb.Fatal(err)
	}
	return e
}

// BenchmarkPaths runs each path through each driver, one transaction per
// operation, at concurrency 1 and 16 (RunParallel), with allocations per
// transaction: the driver's and database/sql's included. See TestIdemAllocs
// for idem's own.
//
//	go test -run '^$' -bench . -benchtime 2s ./internal/bench
func BenchmarkPaths(b *testing.B) {
	ctx := context.Background()
	for _, tg := range targets {
		b.Run(tg.driver, func(b *testing.B) {
			e := seeded(b, tg.open(b), tg.dialect, 16)
			for _, conc := range []int{1, 16} {
				for _, p := range paths {
					if p.hot && conc == 1 {
						continue
					}
					b.Run(fmt.Sprintf("%s-%d", p.name, conc), func(b *testing.B) {
						b.ReportAllocs()
						if conc == 1 {
							body := p.worker(e, 0)
							for b.Loop() {
								if err := body(ctx); err != nil {
									b.Fatal(err)
								}
							}
							return
						}
						parallel(b, conc, func(w int) func(context.Context) error { return p.worker(e, w) })
					})
				}
			}
		})
	}
}

// parallel runs b's iterations in conc workers at once (RunParallel),
// each running the body worker(w) returns for its number w (0..15, so
// that replays spread over the seeded keys), and fails b with the first
// error.
func parallel(b *testing.B, conc int, worker func(w int) func(context.Context) error) {
	ctx := context.Background()
	var (
		next   atomic.Int64
		failed atomic.Pointer[error]
	)
	b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		body := worker(int(next.Add(1)-1) % 16)
		for pb.Next() {
			if err := body(ctx); err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
		}
	})
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}

// mallocs is the number of heap allocations so far, in every goroutine.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// meter is a transaction that counts the heap allocations made inside its
// calls: by database/sql and the driver.
type meter struct {
	*sql.Tx
	allocs uint64
	calls  uint64
}

func (m *meter) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	a := mallocs()
	defer func() { m.allocs += mallocs() - a; m.calls++ }()
	return m.Tx.ExecContext(ctx, q, args...)
}

func (m *meter) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	a := mallocs()
	defer func() { m.allocs += mallocs() - a; m.calls++ }()
	return m.Tx.QueryContext(ctx, q, args...)
}

func (m *meter) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	a := mallocs()
	defer func() { m.allocs += mallocs() - a; m.calls++ }()
	return m.Tx.QueryRowContext(ctx, q, args...)
}

// maxIdemAllocs bounds the heap allocations of one Do outside the driver.
const maxIdemAllocs = 40

// TestIdemAllocs measures the heap allocations one Do makes outside the
// driver: all those between its call and its return, less those inside
// the statements it runs (database/sql and the driver) and inside fn, and
// on a replay less those of reading a row of the same column types with
// Row.Scan, which idem calls but which database/sql and the driver do
// (fetching and converting the row).
func TestIdemAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	ctx := context.Background()
	for _, tg := range targets {
		t.Run(tg.driver, func(t *testing.T) {
			e, err := Setup(ctx, tg.open(t), tg.dialect)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close(ctx) })
			if err := e.Do(ctx, replayKey(0), false); err != nil {
				t.Fatal(err)
			}
			scan, err := e.scanAllocs(ctx, replayKey(0))
			if err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"fresh", "replay"} {
				const runs = 50
				var own, total uint64
				for range runs {
					key := replayKey(0)
					if path == "fresh" {
						key = e.Key()
					}
					tx, err := e.db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					m := &meter{Tx: tx}
					var inFn uint64
					before := mallocs()
					_, err = e.store.Do(ctx, m, Request(key), func(ctx context.Context) (idem.Response, error) {
						a := mallocs()
						defer func() { inFn += mallocs() - a }()
						return response, e.order(ctx, tx, key)
					})
					all := mallocs() - before
					if err != nil {
						t.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
					total += all
					own += all - m.allocs - inFn
					if path == "replay" {
						own -= scan
					}
				}
				t.Logf("%s: %.1f allocations per Do in all, %.1f outside the driver (reading a row: %d)", path, float64(total)/runs, float64(own)/runs, scan)
				if own/runs >= maxIdemAllocs {
					t.Errorf("%s: %d allocations per Do outside the driver, want under %d", path, own/runs, maxIdemAllocs)
				}
			}
		})
	}
}

// scanAllocs is the allocations of Row.Scan reading what a replay reads
// of key's record into the types idem reads it into, outside any idem
// code (the second of two reads, so that pgx's statement cache is warm).
func (e *Env) scanAllocs(ctx context.Context, key string) (uint64, error) {
	q := e.placeholders("SELECT operation, fingerprint, response_status, response_headers, response_body FROM " +
		e.store.Table() + " WHERE scope = ? AND idem_key = ?")
	var (
		op, fp       string
		code         sql.NullInt64
		header, body []byte
	)
	var n uint64
	for range 2 {
		row := e.db.QueryRowContext(ctx, q, "bench", key)
		before := mallocs()
		if err := row.Scan(&op, &fp, &code, &header, &body); err != nil {
			return 0, err
		}
		n = mallocs() - before
	}
	return n, nil
}
