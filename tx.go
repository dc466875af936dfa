package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"
)

// DBTX runs statements: a *sql.Tx, a *sql.DB, a *sql.Conn, and every
// handle with their ExecContext and QueryContext. Do and [Claim.Complete]
// write through it inside the caller's transaction, so there it must be
// one: a *sql.Tx, a *sqlx.Tx (which embeds one), GORM's transaction
// (tx.Statement.ConnPool inside db.Transaction: a *sql.Tx, or with
// PrepareStmt a *gorm.PreparedStmtTX, whose *sql.Tx idem uses,
// unprepared), a bun.Tx (whose *sql.Tx idem uses: bun rewrites statements
// itself), ent's *Tx (generated with the sql/execquery feature, which
// gives it these methods), sqlc's DBTX holding one of these, or a type of
// the caller's with Commit and Rollback methods that wraps one. Do and
// Complete refuse, before any statement, every handle that is not inside
// a transaction: *sql.DB and *sql.Conn satisfy DBTX but run each
// statement on its own and commit it at once, and so do sqlx's, GORM's,
// bun's and ent's pools and connections, and any handle without Commit
// and Rollback. Migrate, [Claim.Extend], [Claim.Release], Inspect and
// Stats take any DBTX, a *sql.DB included. docs/orm.md shows each ORM's
// line. (DBTX had QueryRowContext too until v0.1.0: removing it breaks no
// caller, and lets ent's transaction through.)
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ DBTX = (*sql.DB)(nil)
	_ DBTX = (*sql.Tx)(nil)
	_ DBTX = (*sql.Conn)(nil)
)

// txOf returns the handle that method (Do, Complete) runs its statements
// through inside the caller's transaction tx: tx itself, or the *sql.Tx
// inside a handle that would not run them as sent (rewriterTx). It
// refuses, before any statement, a nil tx of any type (isNil) and a tx
// that is not a transaction (notTx).
func txOf(tx DBTX, method string) (DBTX, error) {
	if sqlTx, ok := tx.(*sql.Tx); ok && sqlTx != nil {
		return sqlTx, nil
	}
	if isNil(tx) {
		return nil, fmt.Errorf("idem: %s needs an open transaction, got nil", method)
	}
	if sqlTx, ok := rewriterTx(tx); ok {
		return sqlTx, nil
	}
	if why := notTx(tx); why != "" {
		return nil, fmt.Errorf("idem: %s needs an open transaction, %s", method, why)
	}
	return tx, nil
}

// rewriters are the transactions, by package and type name, that would
// not run idem's statements as idem sends them, and whose *sql.Tx (their
// field Tx) idem uses instead. A bun.Tx formats a statement itself,
// argument values written into its text, and passes the driver none,
// which PostgreSQL's $1 cannot do without. GORM's *gorm.PreparedStmtTX
// (PrepareStmt) prepares each statement text it runs and caches it (by
// default for a day, without a bound): a prepare more per statement,
// and on MySQL, whose dialect writes the arguments into the text,
// statements more in the cache for every key.
var rewriters = map[[2]string]bool{
	{"github.com/uptrace/bun", "Tx"}:   true,
	{"gorm.io/gorm", "PreparedStmtTX"}: true,
}

// rewriterTx returns the *sql.Tx of a handle of one of the rewriters,
// read by reflection, without importing bun or GORM.
func rewriterTx(tx DBTX) (*sql.Tx, bool) {
	v := reflect.ValueOf(tx)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil, false
		}
		v = v.Elem()
	}
	if t := v.Type(); v.Kind() != reflect.Struct || !rewriters[[2]string{t.PkgPath(), t.Name()}] {
		return nil, false
	}
	f := v.FieldByName("Tx")
	if f.Kind() == reflect.Interface {
		f = f.Elem() // GORM's Tx is an interface, holding the *sql.Tx
	}
	if !f.IsValid() || f.Type() != reflect.TypeFor[*sql.Tx]() || f.IsNil() {
		return nil, false
	}
	return f.Interface().(*sql.Tx), true
}

// IsRetryable reports whether err means the whole transaction should be
// retried: a serialization failure, a deadlock or a lock wait timeout, from
// any of the supported databases and drivers, or idem's own report that a
// key changed hands while it was being claimed, or that the database rolled
// back the transaction under Do (its claim was gone after fn).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errContended) || errors.Is(err, errTxEnded) {
		return true
	}
	for _, d := range dialects {
		if d.retryable(err) {
			return true
		}
	}
	return false
}

// dialects are the Dialects IsRetryable consults.
var dialects = []Dialect{Postgres, MySQL, MariaDB, TiDB, SQLite}

// RunTx runs fn in a transaction on db and commits it. When fn, the begin or
// the commit fails with an error for which [IsRetryable] is true, the
// transaction is rolled back and run again, as [Retry] runs it: up to 10
// attempts in all, after a jittered exponential backoff (5ms doubling to
// at most 500ms), giving up with the last error, and at once when ctx
// ends. fn must not commit or roll back tx itself. A panic in fn rolls
// back and is passed on.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	if db == nil || fn == nil {
		return errors.New("idem: RunTx needs a *sql.DB and a function")
	}
	return Retry(ctx, func() error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		return attempt(ctx, sqlTx{sqlConn{tx}}, func(sqlTx) error { return fn(tx) })
	})
}

// Retry is RunTx's retry loop around any function that runs one whole
// transaction, such as an ORM's transaction helper:
//
//	err := idem.Retry(ctx, func() error {
//		return db.Transaction(func(tx *gorm.DB) error { ... }) // GORM
//	})
//
// fn runs again when it fails with an error for which [IsRetryable] is
// true (the duplicate that lost a race then replays the winner's result),
// up to 10 attempts in all, after a jittered exponential backoff (5ms
// doubling to at most 500ms). Retry returns nil, fn's first error that is
// not retryable, or, after the last attempt, an error that says it gave
// up and wraps the last one; at once when ctx ends, the last error joined
// with ctx's. fn must begin, commit and roll back its transaction itself,
// as the helpers of GORM (db.Transaction), bun (db.RunInTx) and ent do.
func Retry(ctx context.Context, fn func() error) error {
	if fn == nil {
		return errors.New("idem: Retry needs a function")
	}
	backoff := baseBackoff
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !IsRetryable(err) {
			return err
		}
		if attempt == maxAttempts {
			return gaveUp(attempt, err)
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// The bounds of Retry.
const (
	maxAttempts = 10
	baseBackoff = 5 * time.Millisecond
	maxBackoff  = 500 * time.Millisecond
)

// gaveUp is Retry's error after its last attempt failed with err.
func gaveUp(attempts int, err error) error {
	return &Error{Op: "run the transaction", Err: err,
		Detail: fmt.Sprintf("gave up after %d attempts, each rolled back for an error that a retry may cure (IsRetryable): "+
			"the key stayed contended, or something else kept failing the transaction; the last: %s", attempts, reason(err))}
}
