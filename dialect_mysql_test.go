package idem

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// The MySQL dialect reads the driver's *MySQLError without importing the
// driver; this test, which may import it, checks that it still finds the
// number where errors.As would, and nowhere else.
func TestMySQLErrnoReadsTheDriversError(t *testing.T) {
	dup := &mysql.MySQLError{Number: erDupEntry, Message: "Duplicate entry"}
	deadlock := &mysql.MySQLError{Number: erLockDeadlock}
	for name, c := range map[string]struct {
		err       error
		want      uint16
		found     bool
		retryable bool
	}{
		"bare":      {dup, erDupEntry, true, false},
		"wrapped":   {fmt.Errorf("idem: claim: %w", deadlock), erLockDeadlock, true, true},
		"joined":    {errors.Join(errors.New("other"), fmt.Errorf("x: %w", deadlock)), erLockDeadlock, true, true},
		"nil ptr":   {(*mysql.MySQLError)(nil), 0, false, false},
		"other":     {errors.New("Error 1213: Deadlock found"), 0, false, false},
		"nil":       {nil, 0, false, false},
		"lock wait": {&mysql.MySQLError{Number: erLockWaitTimeout}, erLockWaitTimeout, true, true},
	} {
		n, ok := mysqlErrno(c.err)
		if n != c.want || ok != c.found {
			t.Errorf("%s: mysqlErrno = %d, %v; want %d, %v", name, n, ok, c.want, c.found)
		}
		if got := MySQL.retryable(c.err); got != c.retryable {
			t.Errorf("%s: retryable = %v, want %v", name, got, c.retryable)
		}
	}
	if ok, err := MySQL.inserted(0, fmt.Errorf("x: %w", dup)); ok || err != nil {
		t.Errorf("inserted on a duplicate: %v, %v; want false, nil", ok, err)
	}
}
