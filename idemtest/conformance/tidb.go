package conformance

import (
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
)

// session opens a pool of one connection on the target's server and runs
// SET SESSION with each assignment on it, in order (TiDB accepts
// SERIALIZABLE only once the isolation check is skipped); the pool is
// closed when the test ends.
func (e *env) session(assignments ...string) pool {
	e.t.Helper()
	db := e.openOn(e.dsn, 1)
	for _, a := range assignments {
		if _, err := db.ExecContext(ctx, "SET SESSION "+a); err != nil {
			e.t.Fatalf("SET SESSION %s: %v", a, err)
		}
	}
	return db
}

// wantRefused checks that err is idem's refusal naming setting, and that
// neither fn ran nor a record was written.
func wantRefused(t *testing.T, e *env, s *store, o *op, key string, err error, setting string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), setting) {
		t.Fatalf("got %v; want idem's refusal naming %s", err, setting)
	}
	if idem.IsRetryable(err) {
		t.Fatalf("refusal %v is retryable: RunTx would run it again in the same session", err)
	}
	if o.calls.Load() != 0 || e.records(s, key) != 0 || e.count(o.biz, key) != 0 {
		t.Fatalf("after the refusal: %d calls, %d records, %d business rows; want none", o.calls.Load(), e.records(s, key), e.count(o.biz, key))
	}
}

// Each TiDB setting under which a duplicate would not wait for the claim
// is refused by Do and by Begin before fn runs, with an error that names
// it; TiDB's defaults are the baseline that runs.
func testTiDBRefusesUnsafeSessions(t *testing.T) {
	forDialect(t, idem.TiDB, func(t *testing.T, e *env) {
		for _, c := range []struct {
			name    string
			sets    []string
			setting string
		}{
			{"optimistic", []string{"tidb_txn_mode = 'optimistic'"}, "tidb_txn_mode"},
			{"empty mode", []string{"tidb_txn_mode = ''"}, "tidb_txn_mode"},
			{"lazy check", []string{"tidb_constraint_check_in_place_pessimistic = OFF"}, "tidb_constraint_check_in_place_pessimistic"},
			{"serializable", []string{"tidb_skip_isolation_level_check = ON", "transaction_isolation = 'SERIALIZABLE'"}, "SERIALIZABLE"},
			{"skip check", []string{"tidb_skip_isolation_level_check = ON"}, "tidb_skip_isolation_level_check"},
		} {
			t.Run(c.name, func(t *testing.T) {
				e := e.in(t)
				s, o := e.store(), e.op()
				db := e.session(c.sets...)
				req := charge("refused", "100")
				tx, err := db.BeginTx(ctx, nil)
				must(t, err)
				_, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
				must(t, tx.Rollback())
				wantRefused(t, e, s, o, req.Key, err, c.setting)

				claim, replay, err := s.Begin(ctx, db, req)
				if claim != nil || replay != nil {
					t.Fatalf("Begin: claim %v, replay %v; want it refused", claim, replay)
				}
				wantRefused(t, e, s, o, req.Key, err, c.setting)
			})
		}
	})
}

// A level asked for one transaction, as database/sql's BeginTx asks for
// it, does not show in @@transaction_isolation inside it: with the check
// skipped, a SERIALIZABLE transaction is refused by the setting that let
// it begin. With TiDB's default, BEGIN refuses it (8048), and that error
// is not one to retry.
func testTiDBRefusesSerializable(t *testing.T) {
	forDialect(t, idem.TiDB, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("serializable", "100")
		_, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 8048 || idem.IsRetryable(err) {
			t.Fatalf("BEGIN at SERIALIZABLE: %v; want error 8048, not retryable", err)
		}

		db := e.session("tidb_skip_isolation_level_check = ON")
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		must(t, err)
		_, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
		must(t, tx.Rollback())
		wantRefused(t, e, s, o, req.Key, err, "tidb_skip_isolation_level_check")
	})
}

// BEGIN OPTIMISTIC makes one transaction optimistic whatever tidb_txn_mode
// says, and BEGIN PESSIMISTIC one pessimistic: Do goes by the transaction,
// refusing the first and running in the second.
func testTiDBBeginStatementDecides(t *testing.T) {
	forDialect(t, idem.TiDB, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		for _, c := range []struct {
			mode, begin string
			refused     bool
		}{
			{"'pessimistic'", "BEGIN OPTIMISTIC", true},
			{"'optimistic'", "BEGIN PESSIMISTIC", false},
		} {
			req := charge("begin-"+strings.Fields(c.begin)[1], "100")
			tx := e.beginOn(e.session("tidb_txn_mode = "+c.mode), c.begin)
			_, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
			if c.refused {
				must(t, tx.Rollback())
				wantRefused(t, e, s, o, req.Key, err, "BEGIN OPTIMISTIC")
			} else {
				must(t, err)
				must(t, tx.Commit())
				if o.calls.Load() != 1 || e.records(s, req.Key) != 1 || e.count(o.biz, req.Key) != 1 {
					t.Fatalf("%s in an optimistic session: %d calls, %d records, %d rows; want 1 each", c.begin, o.calls.Load(), e.records(s, req.Key), e.count(o.biz, req.Key))
				}
			}
		}
	})
}

// Why the lazy check is refused: with it, concurrent duplicates each run
// fn, and all but one fail at COMMIT (8147). Run without idem's check (a
// plain insert of the record, as idem's claim is), the second duplicate
// does not wait for the first; with TiDB's default it does.
func testTiDBLazyCheckLetsDuplicatesThrough(t *testing.T) {
	forDialect(t, idem.TiDB, func(t *testing.T, e *env) {
		s := e.store()
		insert := "INSERT INTO " + s.Table() + " (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at) VALUES ('t', ?, 'op', 'fp', 'processing', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
		for _, c := range []struct {
			inPlace string
			both    bool // both inserts return before either commits
		}{{"OFF", true}, {"ON", false}} {
			sets := []string{"tidb_constraint_check_in_place_pessimistic = " + c.inPlace, "innodb_lock_wait_timeout = 1"}
			key := "lazy-" + c.inPlace
			first, err := e.session(sets...).BeginTx(ctx, nil)
			must(t, err)
			_, err = first.ExecContext(ctx, insert, key)
			must(t, err)
			dup := e.session(sets...)
			var wg sync.WaitGroup
			var secondErr error
			wg.Go(func() {
				second, err := dup.BeginTx(ctx, nil)
				if err != nil {
					secondErr = err
					return
				}
				defer func() { _ = second.Rollback() }()
				_, secondErr = second.ExecContext(ctx, insert, key)
			})
			wg.Wait()
			must(t, first.Commit())
			if got := secondErr == nil; got != c.both {
				t.Fatalf("in-place check %s: the duplicate's insert returned %v before the first committed; want returned without error = %v", c.inPlace, secondErr, c.both)
			}
		}
	})
}
