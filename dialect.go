package idem

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Dialect adapts idem to one database family: the SQL text it runs and how
// it reads the driver's errors. The implementations are Postgres, MySQL and
// SQLite; the interface is sealed so that it can grow without breaking
// anyone.
type Dialect interface {
	// Name is the family's name: "postgres", "mysql" or "sqlite".
	Name() string

	// quote renders a validated, possibly schema-qualified table name.
	quote(parts []string) string
	// schema returns the DDL statements that create the table.
	schema(parts []string) []string
	// queries returns the statements for the quoted table.
	queries(table string) queries
	// inserted reads the outcome of queries.insert: true when the row was
	// inserted, false when the key already had one.
	inserted(res sql.Result, err error) (bool, error)
	// retryable reports a serialization failure, deadlock or lock timeout.
	retryable(err error) bool
	// size returns a query for the bytes of the table and of its indexes
	// (NULL where the database cannot tell), and its arguments.
	size(parts []string) (query string, args []any)
}

// inliner is implemented by a dialect that writes the arguments of idem's
// statements into their text as literals, so that the driver sends each
// statement in one round trip instead of preparing, executing and closing
// it. inline returns the query and arguments to send: args unchanged when
// it does not inline them.
type inliner interface {
	inline(query string, args []any) (string, []any)
}

// exec runs one of the Store's statements through db.
func (s *Store) exec(ctx context.Context, db DBTX, query string, args ...any) (sql.Result, error) {
	query, args = s.inline(query, args)
	return db.ExecContext(ctx, query, args...)
}

// queryRow runs one of the Store's queries through db.
func (s *Store) queryRow(ctx context.Context, db DBTX, query string, args ...any) *sql.Row {
	query, args = s.inline(query, args)
	return db.QueryRowContext(ctx, query, args...)
}

// inline is the dialect's inline where it has one, else query and args
// as they are.
func (s *Store) inline(query string, args []any) (string, []any) {
	if in, ok := s.dialect.(inliner); ok {
		return in.inline(query, args)
	}
	return query, args
}

// dialects are the Dialects IsRetryable consults.
var dialects = []Dialect{Postgres, MySQL, SQLite}

// queries holds a dialect's statements for one table. The comment on each
// gives its arguments in order; times are computed by the database clock,
// durations are passed in microseconds.
type queries struct {
	// insert claims a new key as PROCESSING, or does nothing (or fails with
	// a duplicate-key error that inserted recognises) when it exists. It
	// waits for an open transaction that holds the key.
	// Args: scope, key, operation, fingerprint, lease.
	insert string
	// get reads a record: operation, fingerprint, status, token, forgotten
	// (past retention), lease left in µs, response status, header and body.
	// On MySQL it is a locking read, so that it sees the latest committed
	// row whatever the transaction's snapshot.
	// Args: retention, scope, key.
	get string
	// takeover makes the record a new PROCESSING claim and grows its token,
	// if the token is still the one read and the record may still be taken
	// over (released, lease ended, or past retention), as the statement
	// sees it: a Complete or Extend that committed between acquire's read
	// and this write wins.
	// Args: operation, fingerprint, lease, scope, key, token, retention.
	takeover string
	// insertToken and takeoverToken are insert and takeover returning the
	// token they wrote and how long after the statement's start the claim
	// was granted, in µs (how long it waited for another transaction that
	// held the key); empty where the dialect cannot return them (MySQL),
	// and token reads them after the claim instead.
	insertToken, takeoverToken string
	// token reads the token of a record the transaction has just claimed,
	// and how long ago, in µs, its claim statement started.
	// Args: scope, key.
	token string
	// state reads a record's status and token as last committed (on MySQL
	// a locking read), to explain why a fenced statement changed nothing.
	// Args: scope, key.
	state string
	// completeClaim, extend, release and remove are fenced: they change
	// the record only while it is the PROCESSING claim with the given
	// token, and then always change a column, so that MySQL, which counts
	// changed rows, reports the match. A fenced statement that escaped its
	// transaction (the database ended it) changes nothing.
	// completeClaim stores the final response (Complete, and Do).
	// Args: response status, header, body, scope, key, token.
	completeClaim string
	// extend moves the lease's end to at least lease from now, and at least
	// one microsecond later than it was (Extend, and Begin's claim when its
	// statement waited). Args: lease, scope, key, token.
	extend string
	// release ends the claim without a result: the next attempt takes the
	// record over at once. Args: scope, key, token.
	release string
	// The statements that bound a lock wait (WithLockTimeout) inside the
	// caller's transaction; their use is the dialect's boundLockWait.
	lockWaitSave, lockWaitSet, lockWaitRestore, lockWaitUndo, lockWaitRelease string
	// remove deletes Do's claim after fn failed. Args: scope, key, token.
	remove string
	// purge deletes at most limit records past retention, never a live
	// claim. Args: retention, retention (again), limit.
	purge string
	// purgeIsolation is the isolation level of the short transaction each
	// purge batch runs in (sql.LevelDefault: the server's default).
	purgeIsolation sql.IsolationLevel
	// inspect reads a record for a person: operation, fingerprint, status,
	// token, lease_until, created_at and completed_at (µs since the Unix
	// epoch; completed_at may be NULL), the database clock (µs), forgotten,
	// response status, header and body. A plain read that locks nothing.
	// Args: retention, scope, key.
	inspect string
	// stats counts the records per status: status, count, oldest created_at
	// (µs since the Unix epoch), how many are past retention (what purge
	// would delete), and the database clock (µs).
	// Args: retention, retention (again).
	stats string
}

// lockWaiter is implemented by the dialects that can bound a lock wait
// inside a transaction, for WithLockTimeout.
type lockWaiter interface {
	// boundLockWait runs fn with every lock wait of db's session bounded by
	// d, and leaves the session's own bound as it found it. timedOut
	// reports that fn failed because a wait ran out; db is then usable,
	// with nothing fn did in it.
	boundLockWait(ctx context.Context, db DBTX, q queries, d time.Duration, fn func() error) (timedOut bool, err error)
}

// parseTable splits a table name into its identifier parts, or explains
// why it is not one.
func parseTable(name string) ([]string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("idem: table name %q: at most one dot (schema.table)", name)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("idem: table name %q: %w", name, err)
		}
	}
	return parts, nil
}

// maxIdentLen leaves room for the suffix of the index name within
// Postgres's 63-byte limit, so no name is ever truncated.
const maxIdentLen = 48

func checkIdent(p string) error {
	if p == "" {
		return fmt.Errorf("empty identifier")
	}
	if len(p) > maxIdentLen {
		return fmt.Errorf("identifier %q is %d bytes, at most %d allowed", p, len(p), maxIdentLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		ok := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
		if !ok {
			return fmt.Errorf("identifier %q: only letters, digits and underscores, not starting with a digit", p)
		}
	}
	return nil
}

// schemaStatements renders a dialect's embedded DDL for a table: the
// default table name is replaced by the quoted one, and the index name
// prefix by the table's own (unqualified) name, then it is split into
// statements at each ";" that ends a line.
func schemaStatements(ddl, quoted, base string) []string {
	ddl = strings.ReplaceAll(ddl, DefaultTable+"_", base+"_")
	ddl = strings.ReplaceAll(ddl, " "+DefaultTable+" ", " "+quoted+" ")
	var stmts []string
	for _, s := range strings.Split(ddl, ";\n") {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			stmts = append(stmts, strings.Join(lines, "\n"))
		}
	}
	return stmts
}
