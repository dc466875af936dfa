package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// Env is the tables one benchmark run works on: an idem table, a table of
// order rows, and a table of idem's shape (the same DDL) that the
// hand-written floor and one-read transactions use, all with fresh random
// names, so that runs never touch anything else on the server. Close drops
// them.
type Env struct {
	db      *sql.DB
	dialect idem.Dialect
	store   *idem.Store
	orders  string // the business table
	insert  string // INSERT of one order row, in the dialect's placeholders
	floor   string // the table of the hand-written transactions
	// The hand-written statements on floor: the claim, the response and
	// the read of a stored row, in the dialect's placeholders.
	floorClaim, floorComplete, floorRead string
	prefix                               string // makes keys unique to this run
	seq                                  atomic.Int64
}

// Setup creates the tables of a run on db.
func Setup(ctx context.Context, db *sql.DB, dialect idem.Dialect) (*Env, error) {
	if db == nil || dialect == nil {
		return nil, errors.New("bench: Setup needs a *sql.DB and an idem.Dialect")
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	tag := hex.EncodeToString(suffix)
	store, err := idem.New(dialect, idem.WithTable("idem_bench_"+tag))
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	floor, err := idem.New(dialect, idem.WithTable("idem_bench_floor_"+tag))
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &Env{
		db:      db,
		dialect: dialect,
		store:   store,
		orders:  "idem_bench_orders_" + tag,
		floor:   floor.Table(),
		prefix:  tag + "-",
	}
	id := "BIGSERIAL PRIMARY KEY"
	switch dialect.Name() {
	case "mysql", "mariadb", "tidb":
		id = "BIGINT AUTO_INCREMENT PRIMARY KEY"
	case "sqlite":
		id = "INTEGER PRIMARY KEY"
	}
	e.insert = e.placeholders("INSERT INTO " + e.orders + " (idem_key, amount) VALUES (?, ?)")
	e.floorStatements()
	if err := e.store.Migrate(ctx, db); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := floor.Migrate(ctx, db); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: %w", err), e.Close(ctx))
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+e.orders+" (id "+id+", idem_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: create %s: %w", e.orders, err), e.Close(ctx))
	}
	return e, nil
}

// floorStatements writes the statements of the hand-written transactions
// the way an application would: arguments as parameters, times from the
// database clock, no token, lease or retention. The claim is the cheapest
// one that lets a duplicate wait for the holder and then learn it lost:
// ON CONFLICT DO NOTHING on PostgreSQL and SQLite (a failing INSERT would
// abort a PostgreSQL transaction), a plain INSERT that fails with 1062 on
// MySQL. The read is a plain one, locking nothing.
func (e *Env) floorStatements() {
	now, conflict := "now()", " ON CONFLICT (scope, idem_key) DO NOTHING"
	switch e.dialect.Name() {
	case "mysql", "mariadb", "tidb":
		now, conflict = "UTC_TIMESTAMP(6)", ""
	case "sqlite":
		now = "(CAST(unixepoch('now', 'subsec') * 1000 AS INTEGER) * 1000)"
	}
	e.floorClaim = e.placeholders("INSERT INTO " + e.floor + " (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)" +
		" VALUES (?, ?, ?, ?, 'processing', 1, " + now + ", " + now + ")" + conflict)
	e.floorComplete = e.placeholders("UPDATE " + e.floor + " SET status = 'completed', completed_at = " + now +
		", response_status = ?, response_headers = ?, response_body = ? WHERE scope = ? AND idem_key = ?")
	e.floorRead = e.placeholders("SELECT operation, fingerprint, status, response_status, response_headers, response_body FROM " +
		e.floor + " WHERE scope = ? AND idem_key = ?")
}

// placeholders numbers q's ? placeholders ($1, $2, ...) on PostgreSQL.
func (e *Env) placeholders(q string) string {
	if e.dialect.Name() != "postgres" {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Close drops the run's tables.
func (e *Env) Close(ctx context.Context) error {
	var errs []error
	for _, t := range []string{e.store.Table(), e.orders, e.floor} {
		if _, err := e.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			errs = append(errs, fmt.Errorf("bench: drop %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// Key returns a key no other call of Key returns.
func (e *Env) Key() string {
	return e.prefix + strconv.FormatInt(e.seq.Add(1), 10)
}

// Request is the request the benchmark sends under key.
func Request(key string) idem.Request {
	return idem.Request{
		Scope:       "bench",
		Key:         key,
		Operation:   "POST /v1/orders",
		Fingerprint: fingerprint,
	}
}

var fingerprint = idem.Fingerprint([]byte("amount=100"))

// response is what the benchmark's operation returns.
var response = idem.Response{StatusCode: 201, Body: []byte(`{"order":"created"}`)}

// Bare is the baseline: BEGIN; INSERT one order row; COMMIT.
func (e *Env) Bare(ctx context.Context) error {
	return e.tx(ctx, func(tx *sql.Tx) error { return e.order(ctx, tx, "bare") })
}

// Fresh runs Do with a new key whose operation inserts one order row.
func (e *Env) Fresh(ctx context.Context) error {
	return e.Do(ctx, e.Key(), false)
}

// Do runs Do for key in a transaction of its own, with an operation that
// inserts one order row, and checks that the result is a replay exactly
// when replay is true.
func (e *Env) Do(ctx context.Context, key string, replay bool) error {
	return e.doOn(ctx, e.store, key, replay)
}

// doOn is Do through the Store s.
func (e *Env) doOn(ctx context.Context, s *idem.Store, key string, replay bool) error {
	return e.tx(ctx, func(tx *sql.Tx) error {
		res, err := s.Do(ctx, tx, Request(key), func(ctx context.Context) (idem.Response, error) {
			return response, e.order(ctx, tx, key)
		})
		if err != nil {
			return err
		}
		if res.Replayed != replay || res.StatusCode != response.StatusCode {
			return fmt.Errorf("bench: key %q: replayed=%v status=%d, want replayed=%v status=%d", key, res.Replayed, res.StatusCode, replay, response.StatusCode)
		}
		return nil
	})
}

// Claim is the two-phase path with a new key: Begin commits a claim in a
// short transaction of its own, then a business transaction inserts one
// order row and completes the claim.
func (e *Env) Claim(ctx context.Context) error {
	key := e.Key()
	c, replay, err := e.store.Begin(ctx, e.db, Request(key))
	switch {
	case err != nil:
		return err
	case replay != nil:
		return fmt.Errorf("bench: Begin of the new key %q replayed", key)
	}
	return e.tx(ctx, func(tx *sql.Tx) error {
		if err := e.order(ctx, tx, key); err != nil {
			return err
		}
		return c.Complete(ctx, tx, response)
	})
}

// Floor is the cheapest hand-written transaction that does what a fresh
// Do does, through the same driver: BEGIN; a claim INSERT of a new key
// into a table of idem's shape; the same order row as Fresh; an UPDATE
// that stores the response in the claim's row; COMMIT.
func (e *Env) Floor(ctx context.Context) error {
	return e.tx(ctx, func(tx *sql.Tx) error { return e.floorOp(ctx, tx, e.Key()) })
}

func (e *Env) floorOp(ctx context.Context, tx *sql.Tx, key string) error {
	req := Request(key)
	res, err := tx.ExecContext(ctx, e.floorClaim, req.Scope, req.Key, req.Operation, req.Fingerprint)
	if err := one(res, err, "claim", key); err != nil {
		return err
	}
	if err := e.order(ctx, tx, key); err != nil {
		return err
	}
	res, err = tx.ExecContext(ctx, e.floorComplete, response.StatusCode, []byte(nil), response.Body, req.Scope, req.Key)
	return one(res, err, "response", key)
}

// one checks that a statement of the floor changed one row.
func one(res sql.Result, err error, what, key string) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n != 1 {
		err = fmt.Errorf("bench: floor %s for key %q changed %d rows, want 1", what, key, n)
	}
	return err
}

// Read is the floor of a replay: BEGIN; one SELECT, by primary key, of
// key's completed row in the floor's table; COMMIT.
func (e *Env) Read(ctx context.Context, key string) error {
	return e.tx(ctx, func(tx *sql.Tx) error {
		var (
			op, fp, status string
			code           sql.NullInt64
			header, body   []byte
		)
		req := Request(key)
		if err := tx.QueryRowContext(ctx, e.floorRead, req.Scope, req.Key).Scan(&op, &fp, &status, &code, &header, &body); err != nil {
			return fmt.Errorf("bench: read key %q: %w", key, err)
		}
		if status != "completed" || code.Int64 != int64(response.StatusCode) {
			return fmt.Errorf("bench: read key %q: status %q, response %d, want completed, %d", key, status, code.Int64, response.StatusCode)
		}
		return nil
	})
}

// crossKeys is how many completed keys each worker of the cross and
// retry paths replays in turn, each once per Store: more than a worker
// runs in one run of 300ms, so that its Store, made before the run,
// seldom has to be made again during it (idem.New renders every statement
// of the table: a quarter of a millisecond).
const crossKeys = 512

// crossKey is the i-th completed key worker w replays on the cross and
// retry paths.
func crossKey(w, i int) string { return fmt.Sprintf("cross-%d-%d", w, i) }

// crossReplayer returns the loop body of worker w of the cross path, and
// with hinted of the retry path: Do replaying a completed key through a
// Store that has not served it, as a retry that reaches another instance
// than the one that ran the request does; with hinted, in a context that
// says the request is a retry (idem.WithRetryHint), as idemhttp's is when
// idemclient resends. The worker replays its crossKeys keys in turn
// through a Store made with it, on the same table, and through a new one
// after each turn, so that no key it replays is one its Store has
// completed or replayed (the completed-key hint is empty for it).
func (e *Env) crossReplayer(w int, hinted bool) func(context.Context) error {
	return replayCross(e.crossKeys(w), hinted, e.doOn)
}

// replayCross replays the keys next gives, each through its Store with
// doOn, saying it retries when hinted.
func replayCross(next func() (*idem.Store, string, error), hinted bool, doOn func(ctx context.Context, s *idem.Store, key string, replay bool) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if hinted {
			ctx = idem.WithRetryHint(ctx)
		}
		s, key, err := next()
		if err != nil {
			return err
		}
		return doOn(ctx, s, key, true)
	}
}

// crossKeys returns what worker w of a cross or retry path replays next,
// on each call: its next key, and a Store on the Env's table that has not
// served it, made anew after each turn of the worker's crossKeys keys.
func (e *Env) crossKeys(w int) func() (*idem.Store, string, error) {
	s, err := idem.New(e.dialect, idem.WithTable(e.store.Table()))
	i := 0
	return func() (*idem.Store, string, error) {
		if i > 0 && i%crossKeys == 0 {
			s, err = idem.New(e.dialect, idem.WithTable(e.store.Table()))
		}
		if err != nil {
			return nil, "", fmt.Errorf("bench: %w", err)
		}
		key := crossKey(w, i%crossKeys)
		i++
		return s, key, nil
	}
}

// Seed completes the keys that replays and reads use, in idem's table
// and in the floor's: replayKey(w) for every worker w < workers, and the
// hot key; and in idem's table the keys of the cross path, crossKey(w, i)
// for every worker w < workers and i < crossKeys, by workers at once.
func (e *Env) Seed(ctx context.Context, workers int) error {
	keys := []string{hotKey}
	for w := range workers {
		keys = append(keys, replayKey(w))
	}
	for _, k := range keys {
		if err := e.Do(ctx, k, false); err != nil {
			return err
		}
		if err := e.tx(ctx, func(tx *sql.Tx) error { return e.floorOp(ctx, tx, k) }); err != nil {
			return err
		}
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range crossKeys {
				if errs[w] = e.Do(ctx, crossKey(w, i), false); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// order inserts one order row through tx.
func (e *Env) order(ctx context.Context, tx idem.DBTX, key string) error {
	_, err := tx.ExecContext(ctx, e.insert, key, 100)
	return err
}

// tx runs fn in a transaction and commits it.
func (e *Env) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// Orders counts the order rows stored under key.
func (e *Env) Orders(ctx context.Context, key string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.placeholders("SELECT COUNT(*) FROM "+e.orders+" WHERE idem_key = ?"), key).Scan(&n)
	return n, err
}
