package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// Env is the pair of tables one benchmark run works on: an idem table and a
// table of order rows, both with fresh random names, so that runs never
// touch anything else on the server. Close drops them.
type Env struct {
	db      *sql.DB
	dialect idem.Dialect
	store   *idem.Store
	orders  string // the business table
	insert  string // INSERT of one order row, in the dialect's placeholders
	prefix  string // makes keys unique to this run
	seq     atomic.Int64
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
	e := &Env{
		db:      db,
		dialect: dialect,
		store:   store,
		orders:  "idem_bench_orders_" + tag,
		prefix:  tag + "-",
	}
	id, ph := "BIGSERIAL PRIMARY KEY", "$1, $2"
	switch dialect.Name() {
	case "mysql":
		id, ph = "BIGINT AUTO_INCREMENT PRIMARY KEY", "?, ?"
	case "sqlite":
		id, ph = "INTEGER PRIMARY KEY", "?, ?"
	}
	e.insert = "INSERT INTO " + e.orders + " (idem_key, amount) VALUES (" + ph + ")"
	if err := e.store.Migrate(ctx, db); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+e.orders+" (id "+id+", idem_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: create %s: %w", e.orders, err), e.Close(ctx))
	}
	return e, nil
}

// Close drops the run's tables.
func (e *Env) Close(ctx context.Context) error {
	var errs []error
	for _, t := range []string{e.store.Table(), e.orders} {
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
	return e.tx(ctx, func(tx *sql.Tx) error {
		res, err := e.store.Do(ctx, tx, Request(key), func(ctx context.Context) (idem.Response, error) {
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
	q := "SELECT COUNT(*) FROM " + e.orders + " WHERE idem_key = ?"
	if e.dialect.Name() == "postgres" {
		q = "SELECT COUNT(*) FROM " + e.orders + " WHERE idem_key = $1"
	}
	var n int
	err := e.db.QueryRowContext(ctx, q, key).Scan(&n)
	return n, err
}
