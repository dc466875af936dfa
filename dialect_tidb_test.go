package idem

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TiDB's write conflicts, lock waits and deadlocks are retryable through
// IsRetryable, wrapped or not; MySQL's dialect does not claim TiDB's
// numbers, and TiDB's refusals of a setting (8048) are not retried.
func TestTiDBRetryable(t *testing.T) {
	for _, n := range []uint16{1205, 1213, 3572, 8002, 8005, 8022, 8028, 8147, 8229, 9004, 9007} {
		err := fmt.Errorf("idem: claim: %w", &mysql.MySQLError{Number: n})
		if !TiDB.retryable(err) || !IsRetryable(err) {
			t.Errorf("error %d: TiDB.retryable %v, IsRetryable %v; want both true", n, TiDB.retryable(err), IsRetryable(err))
		}
	}
	for _, n := range []uint16{1062, 1235, 8048, 8004, 1317} {
		if err := (&mysql.MySQLError{Number: n}); TiDB.retryable(err) {
			t.Errorf("error %d is retryable on TiDB, want not", n)
		}
	}
	if MySQL.retryable(&mysql.MySQLError{Number: 9007}) {
		t.Errorf("MySQL's dialect reports TiDB's 9007: it must stay as it was")
	}
}

// TiDB's statements are MySQL's but for the locking reads, which TiDB
// has as FOR UPDATE (MySQL's keep LOCK IN SHARE MODE), and for the
// settings of a Galera node that MySQL's send in MariaDB's executable
// comment (dialect_galera.go), which TiDB has no use for.
func TestTiDBStatements(t *testing.T) {
	my, ti := MySQL.statements([]string{"t"}), TiDB.statements([]string{"t"})
	onGalera := func(q string) string {
		return galeraComment.ReplaceAllString(q, "")
	}
	for name, q := range map[string][2]Statement{
		"read":          {my.Read, ti.Read},
		"readCompleted": {my.ReadCompleted, ti.ReadCompleted},
		"state":         {my.State, ti.State},
	} {
		if !strings.HasSuffix(q[0].SQL, " LOCK IN SHARE MODE") || !strings.HasSuffix(q[1].SQL, " FOR UPDATE") ||
			strings.TrimSuffix(onGalera(q[0].SQL), " LOCK IN SHARE MODE") != strings.TrimSuffix(q[1].SQL, " FOR UPDATE") {
			t.Errorf("%s: MySQL %q, TiDB %q; want the same read, locked in share mode and for update", name, q[0].SQL, q[1].SQL)
		}
	}
	if a, b := my.Insert, ti.Insert; onGalera(a.SQL) != b.SQL {
		t.Errorf("insert differs: MySQL %q, TiDB %q", a.SQL, b.SQL)
	}
	if ok := TiDB.lockWaiter() != nil; TiDB.Name() != "tidb" || !ok {
		t.Errorf("TiDB: name %q, bounds lock waits %v", TiDB.Name(), ok)
	}
	if c := (&countingConn{}); TiDB.checkSession(t.Context(), conn{c: c}) == nil || c.n != 1 {
		t.Errorf("TiDB does not check the transaction's settings in one statement: %d statements", c.n)
	}
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		if c := (&countingConn{}); d.checkSession(t.Context(), conn{c: c}) != nil || c.n != 0 {
			t.Errorf("%s checks the transaction's settings: that costs a statement per Do", d.Name())
		}
	}
}

// countingConn counts the statements run through it and fails each.
type countingConn struct{ n int }

var errCounted = errors.New("counted, not run")

func (c *countingConn) Exec(context.Context, Query) (int64, error) { c.n++; return 0, errCounted }

func (c *countingConn) QueryRow(context.Context, Query, ...any) error { c.n++; return errCounted }

func (c *countingConn) QueryRows(context.Context, Query, func(func(...any) error) error) error {
	c.n++
	return errCounted
}

// galeraComment is one of MariaDB's executable comments in MySQL's
// statements, with the space that sets it apart.
var galeraComment = regexp.MustCompile(`/\*M! [^*]*\*/ | /\*M! [^*]*\*/`)
