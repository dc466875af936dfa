package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/schema"
)

// TestScale measures idem beside a table filled the way a busy API fills
// it, at each size in IDEM_SCALE_N (default 0,1000000): records with UUID
// keys in 5,000 tenants, 200-byte bodies, created over the last day in
// the order they were created. Once the database has finished the fill's
// background work (settle), it measures at each size, with 16 workers,
// fresh Do and replays of recent keys against a bare transaction
// (alternating runs, median ratio), then a purge of the records past a
// retention that leaves IDEM_SCALE_EXPIRED (default 0.8) of them expired,
// beside 16 workers running fresh Do, and what the database has left to
// reclaim after it: PostgreSQL's dead tuples until autovacuum brings them
// under 10% of the live rows (polled for IDEM_SCALE_VACUUM_WAIT, default
// 5m, with no manual VACUUM), InnoDB's history list length. It prints a
// table with a capacity estimate: the records a day the database takes
// and purges at these rates.
//
// It runs only with IDEM_SCALE=1, on pgx (PostgreSQL), mysql (MariaDB)
// and tidb (TiDB, through the mysql driver): IDEM_SCALE_DRIVERS chooses.
// The records are filled as this release writes them, each with its
// expiry (expires_at: its creation and the retention);
// IDEM_SCALE_LEGACY=1 fills them as the releases before expires_at did
// (NULL), for the purge of a table upgraded with such rows in it.
// IDEM_SCALE_LAYOUT=N builds the table at schema version N instead of the
// newest, for comparison (a layout before expires_at is filled as
// IDEM_SCALE_LEGACY). On TiDB, IDEM_SCALE_TIDB_PURGE chooses how the
// records past retention go: store (the default: the Store's PurgeBatch,
// as everywhere), batch (TiDB's non-transactional DML, BATCH ON
// expires_at LIMIT IDEM_SCALE_BATCH DELETE, run until it deletes
// nothing) or ttl (TiDB's TTL table attribute on expires_at, its job
// every minute, watched until a job has deleted what was due), so that
// the three can be measured side by side. IDEM_SCALE_RUN (default 5s) and IDEM_SCALE_ROUNDS (default
// 3) size the ratio runs, IDEM_SCALE_BATCH (default 5000) the purge's
// batches, IDEM_SCALE_PURGE_FOR (default: until done) bounds the purge.
// IDEM_SCALE_PURGERS (default 1) is how many goroutines purge at once; a
// list (1,4,1,4) purges in phases of IDEM_SCALE_PURGE_FOR each, one per
// count, the workers running throughout, and prints each phase's rate.
// docs/operations.md records its runs.
//
//	IDEM_SCALE=1 IDEM_SCALE_N=0,1000000,5000000 go test -run TestScale -timeout 0 -v ./internal/bench
func TestScale(t *testing.T) {
	if os.Getenv("IDEM_SCALE") != "1" {
		t.Skip("set IDEM_SCALE=1 to run the scale benchmark (minutes to hours)")
	}
	cfg := scaleConfig{
		sizes:    envInts(t, "IDEM_SCALE_N", []int{0, 1_000_000}),
		layout:   envInts(t, "IDEM_SCALE_LAYOUT", []int{0})[0],
		run:      envDuration(t, "IDEM_SCALE_RUN", 5*time.Second),
		rounds:   envInts(t, "IDEM_SCALE_ROUNDS", []int{3})[0],
		batch:    envInts(t, "IDEM_SCALE_BATCH", []int{5000})[0],
		purgeFor: envDuration(t, "IDEM_SCALE_PURGE_FOR", 0),
		purgers:  envInts(t, "IDEM_SCALE_PURGERS", []int{1}),
		wait:     envDuration(t, "IDEM_SCALE_VACUUM_WAIT", 5*time.Minute),
		expired:  0.8,
		workers:  16,
	}
	if v := os.Getenv("IDEM_SCALE_EXPIRED"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f >= 1 {
			t.Fatalf("IDEM_SCALE_EXPIRED=%q: want a fraction between 0 and 1", v)
		}
		cfg.expired = f
	}
	if slices.Contains(cfg.purgers, 0) || len(cfg.purgers) > 1 && cfg.purgeFor == 0 {
		t.Fatalf("IDEM_SCALE_PURGERS=%v: want positive counts, and IDEM_SCALE_PURGE_FOR to bound each phase when there are several", cfg.purgers)
	}
	cfg.legacy = os.Getenv("IDEM_SCALE_LEGACY") == "1"
	switch cfg.tidbPurge = cmp.Or(os.Getenv("IDEM_SCALE_TIDB_PURGE"), "store"); cfg.tidbPurge {
	case "store", "batch", "ttl":
	default:
		t.Fatalf("IDEM_SCALE_TIDB_PURGE=%q: want store, batch or ttl", cfg.tidbPurge)
	}
	drivers := strings.Split(os.Getenv("IDEM_SCALE_DRIVERS"), ",")
	if drivers[0] == "" {
		drivers = []string{"pgx", "mysql", "tidb"}
	}
	ctx := context.Background()
	for _, st := range scaleTargets {
		if !slices.Contains(drivers, st.name) {
			continue
		}
		tg := st.target
		t.Run(st.name, func(t *testing.T) {
			db := tg.open(t)
			// Every connection stays open: with database/sql's default of 2
			// idle ones, the workers' transactions would open a connection
			// each, which is what the runs would measure.
			db.SetMaxOpenConns(cfg.workers + 4)
			db.SetMaxIdleConns(cfg.workers + 4)
			var rows []scaleRow
			for _, n := range cfg.sizes {
				r, err := scale(ctx, db, tg.dialect, cfg, n)
				if err != nil {
					t.Fatal(err)
				}
				rows = append(rows, r)
				printScale(os.Stdout, st.name, rows)
			}
		})
	}
}

// scaleTargets are TestScale's servers, by the name IDEM_SCALE_DRIVERS
// gives them: PostgreSQL through pgx, MariaDB and TiDB through the mysql
// driver.
var scaleTargets = []struct {
	name string
	target
}{
	{"pgx", target{"pgx", idem.Postgres, postgresServer}},
	{"mysql", target{"mysql", idem.MariaDB, mariadbServer}},
	{"tidb", target{"mysql", idem.TiDB, tidbServer}},
}

type scaleConfig struct {
	sizes          []int
	layout         int    // schema version of the table; 0: the newest
	legacy         bool   // fill the records without an expiry, as the releases before it
	tidbPurge      string // on TiDB: store, batch or ttl
	run            time.Duration
	rounds, batch  int
	purgeFor, wait time.Duration
	purgers        []int // goroutines purging at once, one phase per count
	expired        float64
	workers        int
}

// scaleRow is the outcome at one size.
type scaleRow struct {
	layout           string
	records          int
	fill             time.Duration
	bare, fresh      float64 // tx/s, median of the rounds
	freshRatio       float64 // median of the rounds
	p50, p99         time.Duration
	replayRatio      float64
	purged           int64
	purgeTook        time.Duration
	before, during   float64 // fresh tx/s of the workers before and during the purge
	duringP99        time.Duration
	after            string // what the database had left to reclaim
	hot              string // PostgreSQL: HOT completions
	load             string // the load average when the size was done
	tableMB, indexMB float64
}

// scaleTable is one size's tables: the idem table, filled, and the
// orders the operation writes.
type scaleTable struct {
	db      *sql.DB
	dialect idem.Dialect
	store   *idem.Store
	layout  int // the table's schema version; 0: the newest
	orders  string
	insert  string

	mu     sync.Mutex
	recent []idem.Request // keys completed by fresh runs, for replays
}

const (
	scaleTenants = 5000
	scaleBody    = 200
	scaleDay     = 24 * time.Hour
)

// scaleResponse is a response with a body of scaleBody bytes.
var scaleResponse = idem.Response{StatusCode: 201, Body: []byte(strings.Repeat("b", scaleBody))}

// scaleHeader is idem's encoding of Content-Type: application/json.
const scaleHeader = "01010c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e"

// innodb reports a table on MySQL or MariaDB.
func (st *scaleTable) innodb() bool { return st.dialect == idem.MySQL || st.dialect == idem.MariaDB }

// tidb reports a table on TiDB.
func (st *scaleTable) tidb() bool { return st.dialect == idem.TiDB }

// mysqlFamily reports a table that speaks MySQL's SQL: InnoDB's or TiDB's.
func (st *scaleTable) mysqlFamily() bool { return st.innodb() || st.tidb() }

// expiryVersion is the schema version of each dialect's migrations that
// added expires_at.
var expiryVersion = map[string]int{"postgres": 3, "mysql": 3, "mariadb": 3, "tidb": 2}

// hasExpiry reports that the table has the expires_at column.
func (st *scaleTable) hasExpiry() bool {
	return st.layout == 0 || st.layout >= expiryVersion[st.dialect.Name()]
}

// expiryInKey reports a table whose every record has an expiry, which
// leads its primary key: MySQL's from schema version 4.
func (st *scaleTable) expiryInKey() bool {
	return st.innodb() && (st.layout == 0 || st.layout >= 4)
}

func scale(ctx context.Context, db *sql.DB, d idem.Dialect, cfg scaleConfig, n int) (scaleRow, error) {
	tag := make([]byte, 4)
	_, _ = rand.Read(tag)
	suffix := hex.EncodeToString(tag)
	retention := time.Duration(float64(scaleDay) * (1 - cfg.expired))
	s, err := idem.New(d, idem.WithTable("idem_scale_"+suffix), idem.WithRetention(retention))
	if err != nil {
		return scaleRow{}, err
	}
	st := &scaleTable{db: db, dialect: d, store: s, orders: "idem_scale_orders_" + suffix, layout: cfg.layout}
	defer func() {
		for _, table := range []string{s.Table(), st.orders} {
			_, _ = db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+table)
		}
	}()
	row := scaleRow{records: n, layout: "newest"}
	if cfg.layout > 0 {
		row.layout = fmt.Sprintf("version %d", cfg.layout)
	}
	if err := st.create(ctx, cfg.layout); err != nil {
		return row, err
	}
	expiry := retention // each record's, from its creation; 0: none
	if cfg.legacy && st.expiryInKey() {
		return row, fmt.Errorf("IDEM_SCALE_LEGACY=1: every record of %s's %s layout has an expiry; fill a table of an earlier one (IDEM_SCALE_LAYOUT=3)", d.Name(), row.layout)
	}
	if cfg.legacy || !st.hasExpiry() {
		expiry = 0
		row.layout += ", no expiry"
	}
	start := time.Now()
	if err := st.fill(ctx, n, expiry); err != nil {
		return row, err
	}
	row.fill = time.Since(start)
	fmt.Printf("%s, %s layout: filled %d records in %v\n", d.Name(), row.layout, n, row.fill.Round(time.Second))
	if n > 0 {
		settled, err := st.settle(ctx)
		if err != nil {
			return row, err
		}
		fmt.Printf("%s: %s\n", d.Name(), settled)
	}

	fresh, bare := func(ctx context.Context, _ int) error { return st.fresh(ctx) }, func(ctx context.Context, _ int) error { return st.bare(ctx) }
	replay := func(ctx context.Context, w int) error { return st.replay(ctx, w) }
	var freshRates, bareRates, freshRatios, replayRatios []float64
	var lat []time.Duration
	if _, _, err := work(ctx, cfg.workers, time.Second, fresh); err != nil { // warm up the pool and the replay keys
		return row, err
	}
	for range cfg.rounds {
		b1, _, err := work(ctx, cfg.workers, cfg.run, bare)
		if err != nil {
			return row, err
		}
		f, l, err := work(ctx, cfg.workers, cfg.run, fresh)
		if err != nil {
			return row, err
		}
		b2, _, err := work(ctx, cfg.workers, cfg.run, bare)
		if err != nil {
			return row, err
		}
		r, _, err := work(ctx, cfg.workers, cfg.run, replay)
		if err != nil {
			return row, err
		}
		bareRates, freshRates = append(bareRates, b1, b2), append(freshRates, f)
		freshRatios, replayRatios = append(freshRatios, f/b1), append(replayRatios, r/b2)
		lat = append(lat, l...)
	}
	slices.Sort(lat)
	row.bare, row.fresh, row.freshRatio, row.replayRatio = median(bareRates), median(freshRates), median(freshRatios), median(replayRatios)
	row.p50, row.p99 = quantile(lat, 0.5), quantile(lat, 0.99)
	row.hot = st.hotUpdates(ctx)

	if n > 0 {
		if st.tidb() && cfg.tidbPurge != "store" {
			row.layout += ", purge " + cfg.tidbPurge
		}
		if err := st.purge(ctx, cfg, &row); err != nil {
			return row, err
		}
	}
	row.tableMB, row.indexMB = st.size(ctx)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		row.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return row, nil
}

// create makes the idem table at schema version layout (the newest, by
// Migrate, when 0) and the orders table.
func (st *scaleTable) create(ctx context.Context, layout int) error {
	id := "BIGSERIAL PRIMARY KEY"
	migrations := schema.Postgres
	switch {
	case st.innodb():
		id, migrations = "BIGINT AUTO_INCREMENT PRIMARY KEY", schema.MySQL
	case st.tidb():
		id, migrations = "BIGINT AUTO_INCREMENT PRIMARY KEY", schema.TiDB
	}
	if _, err := st.db.ExecContext(ctx, "CREATE TABLE "+st.orders+" (id "+id+", idem_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"); err != nil {
		return err
	}
	st.insert = "INSERT INTO " + st.orders + " (idem_key, amount) VALUES (?, ?)"
	if st.dialect == idem.Postgres {
		st.insert = "INSERT INTO " + st.orders + " (idem_key, amount) VALUES ($1, $2)"
	}
	if layout == 0 {
		return st.store.Migrate(ctx, st.db)
	}
	for _, m := range migrations[:layout] {
		for _, stmt := range strings.Split(strings.ReplaceAll(m.SQL, "idempotency_keys", st.store.Table()), ";\n") {
			var lines []string
			for _, l := range strings.Split(stmt, "\n") {
				if !strings.HasPrefix(strings.TrimSpace(l), "--") {
					lines = append(lines, l)
				}
			}
			if stmt := strings.TrimSpace(strings.Join(lines, "\n")); stmt != "" {
				if _, err := st.db.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", m.Name, err)
				}
			}
		}
	}
	return nil
}

// fill inserts n completed records, oldest first, created evenly over the
// last day, in statements of 50,000 rows, each expiring retention after
// its creation, as Do's records of the Store's retention do (with no
// expiry when retention is 0), and then has the database gather its
// statistics (and PostgreSQL set its hint bits) as it would on a table
// that has run for a day.
func (st *scaleTable) fill(ctx context.Context, n int, retention time.Duration) error {
	const chunk = 50_000
	if n == 0 {
		return nil
	}
	step := scaleDay.Microseconds() / int64(n)
	var keep any // the retention in µs, or NULL: no expiry
	if retention > 0 {
		keep = retention.Microseconds()
	}
	// expires_at, its value and the value's argument, where the table has
	// the column.
	column, value, expiry := ", expires_at", ", ts + INTERVAL ? MICROSECOND", []any{keep}
	if st.dialect == idem.Postgres {
		value = ", ts + $8::bigint * interval '1 microsecond'"
	}
	if !st.hasExpiry() {
		column, value, expiry = "", "", nil
	}
	for from := 0; from < n; from += chunk {
		to := min(n, from+chunk)
		var err error
		if st.mysqlFamily() {
			digits, sum := digits(chunk)
			_, err = st.db.ExecContext(ctx, `INSERT INTO `+st.store.Table()+` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at`+column+`, response_status, response_headers, response_body)
SELECT CONCAT('tenant-', LPAD(FLOOR(RAND() * ?), 6, '0')),
  LOWER(INSERT(INSERT(INSERT(INSERT(MD5(CONCAT(RAND(), i)), 9, 0, '-'), 14, 0, '-'), 19, 0, '-'), 24, 0, '-')),
  'POST /v1/charges', SHA2(i, 256), 'completed', i, ts, ts, ts`+value+`, 201, UNHEX(?), RANDOM_BYTES(?)
FROM (SELECT i, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND + INTERVAL i * ? MICROSECOND AS ts
  FROM (SELECT ? + `+sum+` AS i FROM `+digits+`) g WHERE i < ?) n
ORDER BY i`, slices.Concat([]any{scaleTenants}, expiry, []any{scaleHeader, scaleBody, scaleDay.Microseconds(), step, from, to})...)
		} else {
			_, err = st.db.ExecContext(ctx, `INSERT INTO `+st.store.Table()+` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at`+column+`, response_status, response_headers, response_body)
SELECT 'tenant-' || lpad(floor(random() * $1)::int::text, 6, '0'), gen_random_uuid()::text,
  'POST /v1/charges', encode(sha256(i::text::bytea), 'hex'), 'completed', i, ts, ts, ts`+value+`, 201, decode($2, 'hex'),
  substring(decode(repeat(md5(random()::text), 13), 'hex') FROM 1 FOR $3)
FROM (SELECT i, statement_timestamp() - $4::bigint * interval '1 microsecond' + i * $5::bigint * interval '1 microsecond' AS ts
  FROM generate_series($6::bigint, $7::bigint - 1) i) g`, slices.Concat([]any{scaleTenants, scaleHeader, scaleBody, scaleDay.Microseconds(), step, from, to}, expiry)...)
		}
		if err != nil {
			return fmt.Errorf("fill rows %d..%d: %w", from, to, err)
		}
	}
	q := "ANALYZE TABLE " + st.store.Table()
	if st.dialect == idem.Postgres {
		q = "VACUUM ANALYZE " + st.store.Table()
	}
	_, err := st.db.ExecContext(ctx, q)
	return err
}

// settle waits for the database to finish the fill's background work, so
// that the runs at this size measure a table that holds its records, not
// one loaded a moment ago whose flushing competes with them: on InnoDB
// until its history list is under 1,000 and its dirty pages have stopped
// falling (by less than a tenth in 10 s: InnoDB keeps a share of the pool
// dirty while idle), at most 5 minutes; on PostgreSQL a CHECKPOINT. It
// says what it waited for.
func (st *scaleTable) settle(ctx context.Context) (string, error) {
	start := time.Now()
	if st.tidb() {
		return st.tidbSettle(ctx)
	}
	if !st.innodb() {
		_, err := st.db.ExecContext(ctx, "CHECKPOINT")
		return fmt.Sprintf("checkpoint in %v", time.Since(start).Round(time.Second)), err
	}
	for last := int64(-1); ; time.Sleep(10 * time.Second) {
		dirty, history := st.status(ctx, "Innodb_buffer_pool_pages_dirty"), st.status(ctx, "Innodb_history_list_length")
		switch {
		case dirty < 0 || history < 0:
			return "", errors.New("settle: cannot read InnoDB's status counters")
		case history < 1000 && last >= 0 && dirty*10 >= last*9:
			return fmt.Sprintf("settled in %v: %d pages dirty, history list %d", time.Since(start).Round(time.Second), dirty, history), nil
		case time.Since(start) > 5*time.Minute:
			return fmt.Sprintf("not settled after 5m: %d pages dirty, history list %d", dirty, history), nil
		}
		last = dirty
	}
}

// status reads one of InnoDB's global status counters, or -1.
func (st *scaleTable) status(ctx context.Context, name string) int64 {
	var (
		n string
		v int64
	)
	if err := st.db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&n, &v); err != nil {
		return -1
	}
	return v
}

// request is a fresh request as an API sees one: a UUID key in one of
// the tenants.
func scaleRequest() idem.Request {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return idem.Request{
		Scope:       fmt.Sprintf("tenant-%06d", mrand.IntN(scaleTenants)),
		Key:         h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:],
		Operation:   "POST /v1/charges",
		Fingerprint: fingerprint,
	}
}

func (st *scaleTable) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	return idem.RunTx(ctx, st.db, nil, fn)
}

// bare is the baseline: an order row in a transaction of its own.
func (st *scaleTable) bare(ctx context.Context) error {
	return st.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, st.insert, "bare", 100)
		return err
	})
}

// fresh is Do with a new key, whose operation writes an order row; the
// key is kept for replays.
func (st *scaleTable) fresh(ctx context.Context) error {
	req := scaleRequest()
	err := st.tx(ctx, func(tx *sql.Tx) error {
		res, err := st.store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			_, err := tx.ExecContext(ctx, st.insert, req.Key, 100)
			return scaleResponse, err
		})
		if err == nil && res.Replayed {
			err = fmt.Errorf("fresh key %s/%s replayed", req.Scope, req.Key)
		}
		return err
	})
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.recent) < 100_000 {
		st.recent = append(st.recent, req)
	} else {
		st.recent[mrand.IntN(len(st.recent))] = req
	}
	return nil
}

// replay is Do with a key a fresh run completed: a client's retry.
func (st *scaleTable) replay(ctx context.Context, _ int) error {
	st.mu.Lock()
	req := st.recent[mrand.IntN(len(st.recent))]
	st.mu.Unlock()
	return st.tx(ctx, func(tx *sql.Tx) error {
		res, err := st.store.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
			return idem.Response{}, fmt.Errorf("replay of %s/%s ran fn", req.Scope, req.Key)
		})
		if err == nil && (!res.Replayed || len(res.Body) != scaleBody) {
			err = fmt.Errorf("replay of %s/%s: replayed=%v, %d bytes", req.Scope, req.Key, res.Replayed, len(res.Body))
		}
		return err
	})
}

// work runs conc workers of body for d and returns committed transactions
// per second and every transaction's latency.
func work(ctx context.Context, conc int, d time.Duration, body func(context.Context, int) error) (float64, []time.Duration, error) {
	var (
		wg   sync.WaitGroup
		lats = make([][]time.Duration, conc)
		errs = make([]error, conc)
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if errs[w] = body(ctx, w); errs[w] != nil {
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	all := slices.Concat(lats...)
	return float64(len(all)) / time.Since(start).Seconds(), all, errors.Join(errs...)
}

// purge runs the Store's purge, batch by batch, beside cfg.workers running
// fresh Do, in one phase per count of cfg.purgers goroutines, each phase
// until a batch comes back short or cfg.purgeFor has passed, and then
// watches what the database has left to reclaim.
func (st *scaleTable) purge(ctx context.Context, cfg scaleConfig, row *scaleRow) error {
	stop := make(chan struct{})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lats []time.Duration
		at   []time.Time
		errs = make([]error, cfg.workers)
	)
	begin := time.Now()
	for w := range cfg.workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				if errs[w] = st.fresh(ctx); errs[w] != nil {
					return
				}
				mu.Lock()
				lats, at = append(lats, time.Since(t0)), append(at, t0)
				mu.Unlock()
			}
		})
	}
	time.Sleep(cfg.run)
	done := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(lats)
	}
	phase := st.purgePhase
	if st.tidb() && cfg.tidbPurge != "store" {
		phase = st.tidbPhase
	}
	start := time.Now()
	var err error
	for _, purgers := range cfg.purgers {
		var n int64
		n, err = phase(ctx, cfg, purgers, done)
		row.purged += n
		if err != nil || n == 0 {
			break
		}
	}
	row.purgeTook = time.Since(start)
	close(stop)
	wg.Wait()
	if err := errors.Join(append(errs, err)...); err != nil {
		return err
	}
	var before, during []time.Duration
	for i, t0 := range at {
		switch {
		case t0.Before(start):
			before = append(before, lats[i])
		case t0.Before(start.Add(row.purgeTook)):
			during = append(during, lats[i])
		}
	}
	row.before = float64(len(before)) / start.Sub(begin).Seconds()
	row.during = float64(len(during)) / row.purgeTook.Seconds()
	slices.Sort(during)
	row.duringP99 = quantile(during, 0.99)
	fmt.Printf("%s: purged %d records in %v (%.0f rows/s)\n", st.dialect.Name(), row.purged, row.purgeTook.Round(time.Second), float64(row.purged)/row.purgeTook.Seconds())
	row.after = st.reclaim(ctx, cfg.wait)
	return nil
}

// purgePhase runs purgers goroutines, each calling PurgeBatch until a
// batch comes back short or cfg.purgeFor has passed, prints the phase's
// rate and the workers' (done counts the Do calls they have completed),
// and returns how many records it deleted.
func (st *scaleTable) purgePhase(ctx context.Context, cfg scaleConfig, purgers int, done func() int) (int64, error) {
	var (
		wg     sync.WaitGroup
		purged atomic.Int64
		errs   = make([]error, purgers)
	)
	start, done0 := time.Now(), done()
	for p := range purgers {
		wg.Go(func() {
			for {
				n, err := st.store.PurgeBatch(ctx, st.db, cfg.batch)
				purged.Add(n)
				if err != nil || n < int64(cfg.batch) || cfg.purgeFor > 0 && time.Since(start) > cfg.purgeFor {
					errs[p] = err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	fmt.Printf("%s: %d purgers: purged %d records in %v (%.0f rows/s), workers %.0f tx/s\n", st.dialect.Name(), purgers, purged.Load(),
		took.Round(time.Second), float64(purged.Load())/took.Seconds(), float64(done()-done0)/took.Seconds())
	return purged.Load(), errors.Join(errs...)
}

// reclaim reports what the database has left to reclaim after the purge:
// on PostgreSQL how long autovacuum took to bring the dead tuples under
// 10% of the live ones (polled every 10 s for at most wait), on InnoDB
// the history list length then and a minute later.
func (st *scaleTable) reclaim(ctx context.Context, wait time.Duration) string {
	if st.tidb() {
		return st.tidbReclaim(ctx)
	}
	if st.innodb() {
		first := st.status(ctx, "Innodb_history_list_length")
		time.Sleep(time.Minute)
		return fmt.Sprintf("history list %d, %d a minute later", first, st.status(ctx, "Innodb_history_list_length"))
	}
	start := time.Now()
	var dead, live, vacuums int64
	for {
		err := st.db.QueryRowContext(ctx, `SELECT n_dead_tup, n_live_tup, autovacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			st.store.Table()).Scan(&dead, &live, &vacuums)
		switch {
		case err != nil:
			return err.Error()
		case dead*10 < live:
			return fmt.Sprintf("dead %d < 10%% of live %d after %v (%d autovacuums)", dead, live, time.Since(start).Round(time.Second), vacuums)
		case time.Since(start) > wait:
			return fmt.Sprintf("dead %d, live %d after %v (%d autovacuums)", dead, live, wait, vacuums)
		}
		time.Sleep(10 * time.Second)
	}
}

// hotUpdates is PostgreSQL's count of HOT updates of all updates of the
// table (the statistics may lag a little).
func (st *scaleTable) hotUpdates(ctx context.Context) string {
	if st.dialect != idem.Postgres {
		return "-"
	}
	var hot, all int64
	if err := st.db.QueryRowContext(ctx, `SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`, st.store.Table()).Scan(&hot, &all); err != nil || all == 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(hot)/float64(all))
}

// size is the table's and its indexes' megabytes.
func (st *scaleTable) size(ctx context.Context) (float64, float64) {
	var data, index int64
	q := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`
	if st.mysqlFamily() {
		q = `SELECT data_length, index_length FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name = ?`
	}
	if err := st.db.QueryRowContext(ctx, q, st.store.Table()).Scan(&data, &index); err != nil {
		return math.NaN(), math.NaN()
	}
	return float64(data) / 1e6, float64(index) / 1e6
}

func printScale(w *os.File, driver string, rows []scaleRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tlayout\trecords\tfill\tbare tx/s\tfresh tx/s\tfresh ratio\tfresh p50/p99\treplay ratio\tHOT\tpurged\tpurge rows/s\tworkers before/during purge\tp99 during\tafter the purge\tcapacity/day\ttable/index MB\tload\t\n", driver)
	for _, r := range rows {
		rate, capacity := "-", "-"
		if r.purged > 0 {
			p := float64(r.purged) / r.purgeTook.Seconds()
			rate = fmt.Sprintf("%.0f", p)
			capacity = fmt.Sprintf("%.0fM", 86400/(1/r.fresh+1/p)/1e6)
		}
		fmt.Fprintf(tw, "\t%s\t%d\t%v\t%.0f\t%.0f\t%.2f\t%v/%v\t%.2f\t%s\t%d\t%s\t%.0f/%.0f\t%v\t%s\t%s\t%.0f/%.0f\t%s\t\n",
			r.layout, r.records, r.fill.Round(time.Second), r.bare, r.fresh, r.freshRatio,
			r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.replayRatio, r.hot,
			r.purged, rate, r.before, r.during, r.duringP99.Round(100*time.Microsecond), r.after, capacity, r.tableMB, r.indexMB, r.load)
	}
	_ = tw.Flush()
}

// envInts reads a comma-separated list of non-negative integers, or
// returns def.
func envInts(t *testing.T, name string, def []int) []int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			t.Fatalf("%s=%q: want non-negative integers, comma-separated", name, v)
		}
		ns = append(ns, n)
	}
	return ns
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		t.Fatalf("%s=%q: want a duration", name, v)
	}
	return d
}
