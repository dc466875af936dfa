package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

var ctx = context.Background()

// charge is a request to charge amount under key.
func charge(key, amount string) idem.Request {
	return idem.Request{
		Scope:       "tenant-1",
		Key:         key,
		Operation:   "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte("amount=" + amount)),
	}
}

// op is an operation that inserts one business row for its key through tx
// and counts its executions. Execution n writes "run-n" and answers
// {"key":...,"run":n}.
type op struct {
	e     *env
	biz   string
	calls atomic.Int64
}

func (e *env) op() *op { return &op{e: e, biz: e.business()} }

func (o *op) fn(tx handle, key string) func(context.Context) (idem.Response, error) {
	return func(ctx context.Context) (idem.Response, error) {
		n := o.calls.Add(1)
		if err := o.e.insertRow(tx, o.biz, key, fmt.Sprintf("run-%d", n)); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"key":%q,"run":%d}`, key, n)}, nil
	}
}

// insertRow writes a business row (k, v) into table biz through tx.
func (e *env) insertRow(tx handle, biz, k, v string) error {
	_, err := tx.ExecContext(ctx, e.rebind("INSERT INTO "+biz+" (k, v) VALUES (?, ?)"), k, v)
	return err
}

// do runs s.Do for req with o.fn in a transaction of its own and commits
// it.
func (o *op) do(s *store, req idem.Request) (idem.Result, error) {
	return o.e.do(s, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
}

// begin starts a transaction the test ends (rolled back at cleanup if it
// is still open).
func (e *env) begin(opts *sql.TxOptions) txn {
	e.t.Helper()
	return e.beginIn(e.db, opts)
}

// beginIn is begin on the pool db. A pool the test opened and closes at
// cleanup must begin its transactions here: a *pgxpool.Pool's Close waits
// for every connection to be released, and the rollback at cleanup,
// registered later, runs first.
func (e *env) beginIn(db pool, opts *sql.TxOptions) txn {
	e.t.Helper()
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		e.t.Fatalf("begin: %v", err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// do runs s.Do in a transaction of its own and commits it.
func (e *env) do(s *store, req idem.Request, fn func(tx handle) func(context.Context) (idem.Response, error)) (idem.Result, error) {
	return e.runTxDo(ctx, s, nil, req, fn)
}

// hasTable is a store: the suite's, or an *idem.Store a test hands
// idemhttp.
type hasTable interface{ Table() string }

// records counts the store's records for key.
func (e *env) records(s hasTable, key string) int {
	e.t.Helper()
	return int(e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE idem_key = ?", key))
}

// int64 runs a query that returns one integer.
func (e *env) int64(query string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.db.QueryRow(e.rebind(query), args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// counted returns tx counting the statements run through what it
// returns, and the count.
func counted(tx txn) (txn, *atomic.Int64) {
	n := new(atomic.Int64)
	return tx.watched(func(string) { n.Add(1) }), n
}

// must fails the test on err.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ok is an fn that answers 200 and writes nothing.
func ok(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 200}, nil }

// doOK runs s.Do for req with ok in a transaction of its own.
func (e *env) doOK(s *store, req idem.Request) error {
	_, err := e.do(s, req, func(handle) func(context.Context) (idem.Response, error) { return ok })
	return err
}

// setLease makes the lease of key's record in s end d after the database's
// now (before it when d is negative).
func (e *env) setLease(s *store, key string, d time.Duration) {
	e.t.Helper()
	e.exec("UPDATE "+s.Table()+" SET lease_until = "+e.PlusMicros(e.Now)+" WHERE idem_key = ?", d.Microseconds(), key)
}

// expire ends the lease of key's record in s, by the database's clock.
func (e *env) expire(s *store, key string) {
	e.t.Helper()
	e.setLease(s, key, -time.Second)
}

// age moves every time of key's record in s back by d, as if it had been
// written d earlier: past retention without waiting for it.
func (e *env) age(s *store, key string, d time.Duration) {
	e.t.Helper()
	back := -d.Microseconds()
	e.exec("UPDATE "+s.Table()+" SET created_at = "+e.PlusMicros("created_at")+", completed_at = "+e.PlusMicros("completed_at")+
		", lease_until = "+e.PlusMicros("lease_until")+", expires_at = "+e.PlusMicros("expires_at")+
		", forget_at = "+e.PlusMicros("forget_at")+" WHERE idem_key = ?", back, back, back, back, back, key)
}

// waitBlocked waits until a statement on table waits for a row lock, as a
// duplicate behind a claim the test holds open should, and fails the test
// if done receives first (the statement did not wait) or no statement
// waits within 10 s: until WaitingQuery counts it, then for WaitSettle
// (facts.go says why each database needs what it has).
func waitBlocked[T any](e *env, table string, done chan T) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); e.WaitingQuery != ""; time.Sleep(5 * time.Millisecond) {
		select {
		case v := <-done:
			e.t.Fatalf("the statement on %s did not wait for the lock: %+v", table, v)
		default:
		}
		if e.onEveryNode(e.WaitingQuery, "%"+table+"%") > 0 {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no statement on %s waited for a lock within 10 s", table)
		}
	}
	time.Sleep(e.WaitSettle)
	select {
	case v := <-done:
		e.t.Fatalf("the statement on %s did not wait for the lock: %+v", table, v)
	default:
	}
}

// outcome is what committed for one key in a history: its record (status
// empty when there is none) and the business rows written for it.
type outcome struct {
	status      idem.Status
	fingerprint string
	stored      []byte // the stored response body
}

// completed reports whether the key's record holds a final response.
func (o outcome) completed() bool { return o.status == idem.StatusCompleted }

// committed reads the outcome of key from s's table and the business table
// biz, and reports a key whose business rows disagree with its record: an
// operation committed more than once, a completed record that does not
// replay its one committed execution, or an execution committed without a
// completed record.
func (e *env) committed(t *testing.T, s *store, biz, key string) outcome {
	t.Helper()
	var o outcome
	err := e.db.QueryRow(e.rebind("SELECT status, fingerprint, response_body FROM "+s.Table()+" WHERE idem_key = ?"), key).
		Scan(&o.status, &o.fingerprint, &o.stored)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("read %s: %v", key, err)
	}
	var effects []string
	must(t, e.db.QueryRows(e.rebind("SELECT v FROM "+biz+" WHERE k = ?"), []any{key}, func(scan func(dest ...any) error) error {
		var v string
		err := scan(&v)
		effects = append(effects, v)
		return err
	}))
	switch {
	case len(effects) > 1:
		t.Errorf("%s: committed %d times (%q), want at most once", key, len(effects), effects)
	case o.completed() && (len(effects) != 1 || effects[0] != string(o.stored)):
		t.Errorf("%s: the record replays %q, but the committed executions are %q", key, o.stored, effects)
	case !o.completed() && len(effects) != 0:
		t.Errorf("%s: %q committed, but the record is %q", key, effects, o.status)
	}
	return o
}

// told is what err tells a person: its message, which says what happened,
// and the Hint of each *idem.Error it wraps, which says what to do about
// it and is not part of the message.
func told(err error) string {
	var b strings.Builder
	b.WriteString(err.Error())
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *idem.Error:
			if e.Hint != "" {
				b.WriteString("; hint: " + e.Hint)
			}
			walk(e.Err)
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		case interface{ Unwrap() []error }:
			for _, err := range e.Unwrap() {
				walk(err)
			}
		}
	}
	walk(err)
	return b.String()
}
