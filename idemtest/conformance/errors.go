package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// The errors idem returns say what happened and to which key in their
// message, and what to do in their Hint (told).
func testErrorsSayWhatToDo(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		check := func(what string, err error, want ...string) {
			t.Helper()
			if err == nil {
				t.Fatalf("%s: no error", what)
			}
			for _, w := range want {
				if !strings.Contains(told(err), w) {
					t.Errorf("%s: %q does not say %q", what, told(err), w)
				}
			}
		}

		must(t, e.doOK(s, charge("used", "1")))
		check("mismatch", e.doOK(s, charge("used", "2")), `key "used"`, `scope "tenant-1"`, "use a new key")

		tx := e.begin(nil)
		_, err := s.Do(ctx, tx, charge("bad-status", "1"), func(context.Context) (idem.Response, error) { return idem.Response{}, nil })
		check("status 0", err, "nothing was stored", "roll back")
		must(t, tx.Rollback())

		e.exec("UPDATE "+s.Table()+" SET response_headers = ? WHERE scope = ? AND idem_key = ?", []byte{9}, "tenant-1", "used")
		check("corrupt header", e.doOK(s, charge("used", "1")), `key "used"`, "delete the record by hand")

		if e.SnapshotRetryable {
			// A snapshot older than the winner's commit: the database
			// aborts the duplicate (Postgres's serialization failure,
			// SQLite's SQLITE_BUSY_SNAPSHOT).
			old := e.oldSnapshot()
			var n int
			must(t, old.QueryRow("SELECT COUNT(*) FROM "+s.Table()).Scan(&n)) // takes the snapshot
			must(t, e.doOK(s, charge("raced", "1")))
			_, err := s.Do(ctx, old, charge("raced", "1"), ok)
			check("serialization failure", err, `claim for key "raced"`, "run the whole transaction again")
			if !idem.IsRetryable(err) {
				t.Errorf("serialization failure: IsRetryable false for %v", err)
			}
		}

		missing, err := idem.New(e.Dialect, idem.WithTable("missing_"+strings.TrimPrefix(s.Table(), "idem_")))
		must(t, err)
		bad := e.onDriver(missing)
		tx = e.begin(nil)
		_, err = bad.Do(ctx, tx, charge("k", "1"), ok)
		check("missing table", err, `claim for key "k"`, "roll back the transaction")
		if errors.Is(err, idem.ErrMismatch) || idem.IsRetryable(err) {
			t.Errorf("missing table: %v classified as mismatch or retryable", err)
		}
	})
}

// On a table of an earlier schema version, the message of the error
// (what a service logs) names the table as such, not only the driver's
// "column ... does not exist"; the Hint still says to run Migrate. So
// do Begin's and Inspect's.
func testOlderTableNamed(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.createRelease1()
		named := func(what string, err error) {
			t.Helper()
			var ie *idem.Error
			switch {
			case err == nil:
				t.Fatalf("%s on a table of release 1: no error", what)
			case !strings.Contains(err.Error(), "table "+s.Table()+" is of an earlier schema version"):
				t.Errorf("%s on a table of release 1: Error() %q does not name the table as of an earlier schema version", what, err)
			case !errors.As(err, &ie) || !strings.Contains(ie.Hint, "Migrate"):
				t.Errorf("%s on a table of release 1: %q, want a Hint that says to run Migrate", what, told(err))
			}
		}
		named("Do", e.doOK(s, charge("k", "1")))
		_, _, err := s.Begin(ctx, e.db, charge("k", "1"))
		named("Begin", err)
		_, err = s.Inspect(ctx, e.db, "tenant-1", "k")
		named("Inspect", err)
	})
}
