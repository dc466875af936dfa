package idem

import (
	"database/sql"
	sqldriver "database/sql/driver"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// notTx says why h, a handle given to run idem's statements inside the
// caller's transaction (Do, Complete), is not one, or returns "" when it
// may be. A transaction can end itself: its type has Commit and Rollback
// methods (*sql.Tx, *sqlx.Tx, ent's *Tx, GORM's *gorm.PreparedStmtTX, a type
// of the caller's that embeds one). Anything else runs each statement on
// its own and commits it at once: a pool, a connection, an ORM's DB or
// prepared pool, and any type idem does not know that lacks them, so the
// next ORM's pool is refused too, not only the ones named here. The reason
// names the type, what it is, and what to pass instead. The verdict
// depends only on h's type and is worked out once per type.
func notTx(h any) string {
	if _, ok := h.(*sql.Tx); ok {
		return ""
	}
	t := reflect.TypeOf(h)
	if why, ok := verdicts.Load(t); ok {
		return why.(string)
	}
	why := notTxType(t)
	verdicts.Store(t, why)
	return why
}

// isNil reports whether h, a handle, is nil: an untyped nil, or a nil
// pointer (a *sql.Tx, a *sqlx.Tx, ent's *Tx, a caller's type around one),
// map, slice, channel or function of any type, which an interface holds
// as a non-nil value. Every method that takes a handle refuses one before
// any statement, with the message an untyped nil gets, rather than
// calling a method on it that dereferences nil.
func isNil(h any) bool {
	if h == nil {
		return true
	}
	switch v := reflect.ValueOf(h); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// verdicts caches notTx's answer per dynamic type.
var verdicts sync.Map // reflect.Type -> string

func notTxType(t reflect.Type) string {
	_, commits := t.MethodByName("Commit")
	_, rollsBack := t.MethodByName("Rollback")
	if commits && rollsBack {
		return ""
	}
	what := "it has no Commit and Rollback methods, so it is not a transaction and each statement through it would commit on its own"
	for _, m := range beginners {
		if _, ok := t.MethodByName(m); ok {
			what = fmt.Sprintf("it can begin transactions (it has %s) rather than being one, so each statement through it would commit on its own", m)
			break
		}
	}
	return fmt.Sprintf("got %v: %s; %s", t, what, insteadOf(t))
}

// beginners are the names of the methods that begin a transaction or take
// a connection, in the pools and connections of database/sql, sqlx,
// GORM, bun and ent.
var beginners = []string{"BeginTx", "Begin", "Beginx", "BeginTxx", "RunInTx", "Transaction", "Tx", "Conn", "Acquire"}

// insteadOf says what to pass in place of a handle of type t, by the
// package t comes from.
func insteadOf(t reflect.Type) string {
	pkg := t.PkgPath()
	if t.Kind() == reflect.Pointer {
		pkg = t.Elem().PkgPath()
	}
	for _, h := range hints {
		if pkg == h.pkg || strings.HasPrefix(pkg, h.pkg+"/") {
			return h.instead
		}
	}
	return "pass the transaction itself: a *sql.Tx (idem.RunTx begins and retries one), a *sqlx.Tx, or your ORM's transaction (docs/orm.md); a type of your own that wraps one needs its Commit and Rollback methods (embedding *sql.Tx gives it them)"
}

// hints are what to pass instead of a pool or connection, by its package.
var hints = []struct{ pkg, instead string }{
	{"database/sql", "pass the *sql.Tx that db.BeginTx returns, or run Do inside idem.RunTx, which begins, commits and retries it; from an ORM or query builder, its transaction's (docs/orm.md)"},
	{"github.com/jmoiron/sqlx", "pass the *sqlx.Tx that db.Beginx returns, or the *sql.Tx of idem.RunTx"},
	{"gorm.io/gorm", "inside db.Transaction(func(tx *gorm.DB) error { ... }), pass tx.Statement.ConnPool (docs/orm.md)"},
	{"github.com/uptrace/bun", "inside db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { ... }), pass tx (docs/orm.md)"},
	{"entgo.io/ent", "pass ent's *Tx, from client.Tx or client.BeginTx, generated with the sql/execquery feature (docs/orm.md)"},
}

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

// embeddedTx is db as a *sql.Tx, or the *sql.Tx in an exported field of
// the struct db points to (*sqlx.Tx embeds one); nil when it is neither.
func embeddedTx(db DBTX) *sql.Tx {
	if tx, ok := db.(*sql.Tx); ok {
		return tx
	}
	v := reflect.ValueOf(db)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Type() == txType && f.CanInterface() && !f.IsNil() {
			return f.Interface().(*sql.Tx)
		}
	}
	return nil
}

var txType = reflect.TypeFor[*sql.Tx]()

// driverField is the value of the first field of the struct c whose type is
// driver.Driver, with its dynamic type; the zero Value when there is none.
func driverField(c reflect.Value) reflect.Value {
	for i := range c.NumField() {
		if f := c.Field(i); f.Type() == driverType && !f.IsNil() {
			return f.Elem()
		}
	}
	return reflect.Value{}
}

// The fields onLibPQ reads: Tx.db and DB.connector, or no Index where
// database/sql has no such field.
var (
	txDB, _        = reflect.TypeFor[sql.Tx]().FieldByName("db")
	dbConnector, _ = reflect.TypeFor[sql.DB]().FieldByName("connector")
	driverType     = reflect.TypeFor[sqldriver.Driver]()
)
