package conformance

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Behind a pooler in transaction mode (Pooled: PgBouncer) each
// transaction runs on whichever server session of the pool is free, after
// any other client's transactions: what one leaves in the session, the
// next finds. The tests here run on the pooled targets only.

// forPooled runs body as a parallel subtest per target behind a pooler
// whose row says runs.
func forPooled(t *testing.T, runs func(Target) bool, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(tg Target) bool { return tg.Pooled && runs(tg) }, body)
}

// poolOfOne is the target's PoolOfOne, or skips the test where it has
// none.
func (e *env) poolOfOne() (dsn, defaults string) {
	e.t.Helper()
	if e.PoolOfOne == nil {
		e.t.Skipf("%s offers no pool of one server connection (Target.PoolOfOne)", e.Name)
	}
	return e.PoolOfOne(e.t)
}

// singleSession is held by a test that needs the one server session of
// the pooler's pool of one (Target.PoolOfOne) to itself: its pooled targets take turns.
var singleSession sync.Mutex

// openOn opens a pool of at most conns connections on dsn with the
// target's driver, closed when the test ends.
func (e *env) openOn(dsn string, conns int) pool {
	e.t.Helper()
	db, err := e.connect(dsn, conns)
	if err != nil {
		e.t.Fatalf("open %s: %v", dsn, err)
	}
	e.t.Cleanup(db.close)
	return db
}

// sessionState is what a server session keeps from one transaction to
// the next, in one string: its backend, every setting, and the prepared
// statements, advisory locks, LISTEN channels, open cursors and
// temporary tables it holds.
const sessionState = `SELECT concat_ws(' | ', 'backend ' || pg_backend_pid(),
  'lock_timeout ' || current_setting('lock_timeout') || ' (server default ' || (SELECT reset_val FROM pg_settings WHERE name = 'lock_timeout') || ')',
  (SELECT COUNT(*) FROM pg_prepared_statements) || ' prepared statements',
  (SELECT COUNT(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory') || ' advisory locks',
  (SELECT COUNT(*) FROM pg_listening_channels()) || ' channels listened to',
  (SELECT COUNT(*) FROM pg_cursors WHERE name <> '') || ' cursors',
  (SELECT COUNT(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()) || ' temporary tables',
  (SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings))`

// idem leaves nothing in a pooled server session: through a pool of one
// server connection (Target.PoolOfOne: PgBouncer's), in the target's driver
// settings, every call of idem's, WithLockTimeout's bounded wait
// included, is followed by a transaction that finds the session as it
// was before the first, on the same backend: lock_timeout at the
// server's default, no prepared statement, advisory lock, listened
// channel, cursor or temporary table, every setting unchanged.
func testPooledSessionKeepsNothing(t *testing.T) {
	forPooled(t, func(Target) bool { return true }, func(t *testing.T, e *env) {
		dsn, _ := e.poolOfOne()
		single := e.openOn(dsn, 2)
		s, o := e.store(idem.WithLockTimeout(300*time.Millisecond), idem.WithRetention(time.Hour)), e.op()
		state := func() string {
			t.Helper()
			var st string
			must(t, single.QueryRow(sessionState).Scan(&st))
			return st
		}
		in := func(fn func(tx txn) error) error {
			tx := e.beginIn(single, nil)
			if err := fn(tx); err != nil {
				return errors.Join(err, tx.Rollback())
			}
			return tx.Commit()
		}
		req := charge("pooled", "100")
		held := charge("pooled-held", "100")
		var c *claim
		before := state()
		if !strings.Contains(before, "lock_timeout 0 (server default 0)") {
			t.Fatalf("the server session's lock_timeout is not the default 0 before the test: %s", before)
		}
		for _, step := range []struct {
			name string
			run  func() error
		}{
			{"Migrate", func() error { return s.Migrate(ctx, single) }},
			{"Do on a fresh key", func() error {
				return in(func(tx txn) error { _, err := s.Do(ctx, tx, req, o.fn(tx, req.Key)); return err })
			}},
			{"Do replaying it", func() error {
				return in(func(tx txn) error {
					res, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
					if err == nil && !res.Replayed {
						err = errors.New("not a replay")
					}
					return err
				})
			}},
			{"Do giving up on a held key (lock_timeout)", func() error {
				holder := e.begin(nil) // on the target's pool: another server session
				if _, err := s.Do(ctx, holder, held, o.fn(holder, held.Key)); err != nil {
					return err
				}
				defer func() { _ = holder.Rollback() }()
				return in(func(tx txn) error {
					_, err := s.Do(ctx, tx, held, o.fn(tx, held.Key))
					if !errors.Is(err, idem.ErrInFlight) {
						return errors.Join(errors.New("want ErrInFlight after lock_timeout"), err)
					}
					return nil // the transaction is usable: it commits
				})
			}},
			{"Begin", func() (err error) { c, _, err = s.Begin(ctx, single, charge("pooled-claim", "1")); return err }},
			{"Extend", func() error { return c.Extend(ctx, single, time.Minute) }},
			{"Complete", func() error {
				return in(func(tx txn) error { return c.Complete(ctx, tx, idem.Response{StatusCode: 201}) })
			}},
			{"Begin and Release", func() error {
				c, _, err := s.Begin(ctx, single, charge("pooled-released", "1"))
				if err != nil {
					return err
				}
				return c.Release(ctx, single)
			}},
			{"Inspect", func() error { _, err := s.Inspect(ctx, single, req.Scope, req.Key); return err }},
			{"Stats", func() error { _, err := s.Stats(ctx, single); return err }},
			{"Purge", func() error { _, err := s.Purge(ctx, single, 10); return err }},
		} {
			if err := step.run(); err != nil {
				t.Fatalf("%s through the pool of one: %v", step.name, err)
			}
			if after := state(); after != before {
				t.Fatalf("after %s the server session is\n  %s\nwas\n  %s", step.name, after, before)
			}
		}
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows for %s, want 1", n, req.Key)
		}
	})
}

// A driver's statement cache behind a pooler without prepared-statement
// tracking (PgBouncer 1.18, or 1.21+ without max_prepared_statements): in
// pgx's default mode two client connections prepare the same statements
// on one server session, so the second's fail with SQLSTATE 42P05
// (duplicate_prepared_statement), and once the session has lost them, the
// first's fail with 26000 (invalid_sql_statement_name). idem's errors
// name the fix, the query mode or PgBouncer's max_prepared_statements,
// and Migrate's no longer sends the user to the catalog's permissions.
func testPoolerStatementCacheNamesTheFix(t *testing.T) {
	forPooled(t, func(tg Target) bool { return tg.CachesStatements }, func(t *testing.T, e *env) {
		settings, dsn := e.poolOfOne() // dsn: the driver's defaults, its statement cache
		singleSession.Lock()
		t.Cleanup(singleSession.Unlock) // after the pools close and the statements go
		first, second := e.openOn(dsn, 1), e.openOn(dsn, 1)
		t.Cleanup(func() { _, _ = e.openOn(settings, 1).Exec("DEALLOCATE ALL") })
		s := e.store()
		fix := func(what string, err error, state string) {
			t.Helper()
			var st interface{ SQLState() string }
			switch {
			case err == nil:
				t.Fatalf("%s: no error; want SQLSTATE %s from the statement cache", what, state)
			case !errors.As(err, &st) || st.SQLState() != state:
				t.Fatalf("%s: %v; want SQLSTATE %s, wrapped", what, err, state)
			case !strings.Contains(told(err), "default_query_exec_mode=exec") || !strings.Contains(told(err), "max_prepared_statements"):
				t.Errorf("%s: %v; want the fix named: the query mode or PgBouncer's max_prepared_statements", what, told(err))
			case strings.Contains(told(err), "catalog"):
				t.Errorf("%s: %v; it sends the user to the catalog's permissions", what, told(err))
			case idem.IsRetryable(err):
				t.Errorf("%s: %v is retryable: a retry fails the same way", what, err)
			}
		}
		do := func(db pool, key string) error {
			return runTx(ctx, db, nil, func(tx txn) error { _, err := s.Do(ctx, tx, charge(key, "1"), ok); return err })
		}
		must(t, s.Migrate(ctx, first))
		must(t, do(first, "cached"))
		fix("Migrate through a second client connection", s.Migrate(ctx, second), "42P05")
		fix("Do through a second client connection", do(second, "cached-again"), "42P05")
		_, err := second.Exec("DEALLOCATE ALL")
		must(t, err)
		fix("Do after the server session lost the statements", do(first, "lost"), "26000")
	})
}
