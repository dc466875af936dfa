package conformance

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Migrate creating a table that did not exist does not wait on the
// transactions open elsewhere in the database: an index on a table it
// has just created is built plainly, not CONCURRENTLY (which on
// PostgreSQL waits for every transaction older than the build, whatever
// table it touches). Here one stays open, with a transaction ID and a
// snapshot, for the whole Migrate. Four Migrates of one new table at
// once all succeed.
func testMigrateNewTableDoesNotWait(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		holder := e.begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		defer holder.Rollback()
		var xid int64
		must(t, holder.QueryRow("SELECT txid_current()").Scan(&xid))
		table := randName("idem")
		e.dropLater(table)
		st, err := idem.New(e.Dialect, idem.WithTable(table))
		must(t, err)
		s := e.onDriver(st)
		bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		if err := s.Migrate(bounded, e.db); err != nil {
			t.Fatalf("Migrate of a new table beside an open transaction: %v after %v", err, time.Since(start).Round(time.Millisecond))
		}
		t.Logf("Migrate of a new table beside an open transaction: %v", time.Since(start).Round(time.Millisecond))
		must(t, e.doOK(s, charge("k", "1")))
		must(t, s.Migrate(ctx, e.db))

		// Several processes creating one table at once: each Migrate
		// succeeds, and the table works. (One that finds the table
		// already created builds its indexes CONCURRENTLY, and waits for
		// the transactions open before: not the holder's, now ended.)
		must(t, holder.Rollback())
		table = randName("idem")
		e.dropLater(table)
		st, err = idem.New(e.Dialect, idem.WithTable(table))
		must(t, err)
		s = e.onDriver(st)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = s.Migrate(ctx, e.db) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Migrate %d of 4 at once: %v", i, err)
			}
		}
		must(t, e.doOK(s, charge("k", "1")))
	})
}
