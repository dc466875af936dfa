package conformance

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
)

// 1. A fresh key runs fn once; the record and the business row commit or
// roll back together.
func testFreshKeyCommitsWithBusinessRows(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("fresh-1", "100")

		tx := e.begin(nil)
		res, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
		must(t, err)
		if res.Replayed || res.StatusCode != 201 {
			t.Fatalf("first Do: %+v", res)
		}
		must(t, tx.Rollback())
		if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 0 || r != 0 {
			t.Fatalf("after rollback: %d business rows, %d records; want 0, 0", n, r)
		}

		tx = e.begin(nil)
		res, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
		must(t, err)
		must(t, tx.Commit())
		if res.Replayed || o.calls.Load() != 2 {
			t.Fatalf("retry after rollback: replayed=%v calls=%d; want a second execution", res.Replayed, o.calls.Load())
		}
		if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 1 || r != 1 {
			t.Fatalf("after commit: %d business rows, %d records; want 1, 1", n, r)
		}
	})
}

// 2. A replay is byte-identical and does not call fn, whatever the body's
// size (on MySQL small statements carry their arguments as literals, large
// ones as parameters) and bytes.
func testReplayIsByteIdentical(t *testing.T) {
	large := make([]byte, 1<<20)
	for i := range large {
		large[i] = byte(i * 7)
	}
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	header := http.Header{
		"Content-Type": {"application/octet-stream"},
		"X-Multi":      {"one", "two", ""},
		"x-lower-case": {"kept as stored"},
		"X-Bytes":      {"caf\xc3\xa9 \x80\xff ' \\ ?"},
	}
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		for i, body := range [][]byte{large, every, {}, nil} {
			req := charge(fmt.Sprintf("replay-%d", i), "100")
			req.Scope = "tenant ' \\ ? \u00e9"
			calls := 0
			fn := func(handle) func(context.Context) (idem.Response, error) {
				return func(context.Context) (idem.Response, error) {
					calls++
					return idem.Response{StatusCode: 402, Header: header, Body: body}, nil
				}
			}
			first, err := e.do(s, req, fn)
			must(t, err)
			second, err := e.do(s, req, fn)
			must(t, err)
			if calls != 1 || first.Replayed || !second.Replayed {
				t.Fatalf("body of %d bytes: calls=%d first.Replayed=%v second.Replayed=%v; want 1, false, true", len(body), calls, first.Replayed, second.Replayed)
			}
			if second.StatusCode != 402 || !bytes.Equal(second.Body, body) {
				t.Fatalf("replayed status %d, body of %d bytes (equal to the %d stored: %v)", second.StatusCode, len(second.Body), len(body), bytes.Equal(second.Body, body))
			}
			if !equalHeader(second.Header, header) {
				t.Fatalf("replayed header %q, want %q", second.Header, header)
			}
		}
	})
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || strings.Join(v, "\x00") != strings.Join(w, "\x00") || len(v) != len(w) {
			return false
		}
	}
	return true
}

// 3. A storm of duplicates, each in its own transaction, runs fn once and
// replays it everywhere else, under every isolation level.
func testStormRunsOnce(t *testing.T) {
	const workers = 32
	forEach(t, func(t *testing.T, e *env) {
		for _, level := range isolationLevels {
			t.Run(levelName(level), func(t *testing.T) {
				e := e.in(t)
				e.skipLevel(level)
				s, o := e.store(), e.op()
				req := charge("storm", "100")
				var (
					wg      sync.WaitGroup
					mu      sync.Mutex
					results []idem.Result
					errs    []error
				)
				start := make(chan struct{})
				for range workers {
					wg.Go(func() {
						<-start
						var res idem.Result
						err := runTx(ctx, e.db, &sql.TxOptions{Isolation: level}, func(tx txn) error {
							var err error
							res, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
								time.Sleep(50 * time.Millisecond)
								return o.fn(tx, req.Key)(ctx)
							})
							return err
						})
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							errs = append(errs, err)
							return
						}
						results = append(results, res)
					})
				}
				close(start)
				wg.Wait()
				for _, err := range errs {
					t.Errorf("worker error: %v", err)
				}
				if n := e.count(o.biz, req.Key); n != 1 {
					t.Fatalf("%d business rows, want exactly 1", n)
				}
				executed, replayed := 0, 0
				for _, r := range results {
					if r.Replayed {
						replayed++
					} else {
						executed++
					}
					if !bytes.Equal(r.Body, results[0].Body) || r.StatusCode != 201 {
						t.Errorf("result %d %q differs from %q", r.StatusCode, r.Body, results[0].Body)
					}
				}
				if executed != 1 || replayed != workers-1 {
					t.Fatalf("executed %d, replayed %d; want 1 and %d", executed, replayed, workers-1)
				}
			})
		}
	})
}

// 4. Another Operation or Fingerprint under a used key is ErrMismatch, also
// while the first request is still in flight.
func testMismatch(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("mismatch-1", "100")
		_, err := o.do(s, req)
		must(t, err)

		other := charge(req.Key, "999")
		otherOp := req
		otherOp.Operation = "POST /v1/refunds"
		for _, r := range []idem.Request{other, otherOp} {
			_, err := o.do(s, r)
			if !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("reuse with %+v: err = %v, want ErrMismatch", r, err)
			}
		}

		// In flight inside another open transaction: the duplicate waits
		// for it, then is told.
		inflight := charge("mismatch-2", "100")
		tx1 := e.begin(nil)
		_, err = s.Do(ctx, tx1, inflight, o.fn(tx1, inflight.Key))
		must(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := o.do(s, charge(inflight.Key, "999"))
			done <- err
		}()
		waitBlocked(e, s.Table(), done)
		must(t, tx1.Commit())
		if err := <-done; !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("duplicate after commit: %v, want ErrMismatch", err)
		}

		// In flight as a committed PROCESSING claim with a live lease.
		claimed := charge("mismatch-3", "100")
		e.leaveClaim(s, claimed, time.Minute)
		_, err = o.do(s, charge(claimed.Key, "999"))
		if !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("other payload while claimed: %v, want ErrMismatch", err)
		}
		if n := o.calls.Load(); n != 2 {
			t.Fatalf("fn ran %d times, want 2", n)
		}
	})
}

// leaveClaim leaves a committed PROCESSING record for req whose lease ends
// after lease (in the past when negative), as a crashed Begin would.
func (e *env) leaveClaim(s *store, req idem.Request, lease time.Duration) {
	e.t.Helper()
	tx := e.begin(nil)
	_, err := s.Do(ctx, tx, req, ok)
	must(e.t, err)
	must(e.t, tx.Commit())
	e.exec("UPDATE "+s.Table()+" SET status = 'processing', completed_at = NULL, response_status = NULL WHERE idem_key = ?", req.Key)
	e.setLease(s, req.Key, lease)
}

// 5. One key under two scopes is two keys.
func testScopesAreSeparate(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		a := charge("shared-key", "100")
		b := a
		b.Scope = "tenant-2"
		for _, r := range []idem.Request{a, b, a, b} {
			_, err := o.do(s, r)
			must(t, err)
		}
		if n := e.count(o.biz, a.Key); n != 2 {
			t.Fatalf("%d business rows, want 2 (one per scope)", n)
		}
	})
}

var errDeclined = errors.New("provider unreachable")

// 6. An error from fn comes back unchanged and nothing is stored.
func testFnErrorStoresNothing(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("fn-error", "100")
		tx := e.begin(nil)
		_, err := s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
			return idem.Response{}, errDeclined
		})
		if !errors.Is(err, errDeclined) {
			t.Fatalf("err = %v, want errDeclined", err)
		}
		// Even a caller that commits regardless leaves the key free.
		must(t, tx.Commit())
		if r := e.records(s, req.Key); r != 0 {
			t.Fatalf("%d records after fn failed, want 0", r)
		}
		res, err := o.do(s, req)
		must(t, err)
		if res.Replayed || o.calls.Load() != 1 {
			t.Fatalf("retry: replayed=%v calls=%d; want a fresh execution", res.Replayed, o.calls.Load())
		}
	})
}

// 7. Bad keys fail before any statement; keys compare byte for byte.
func testKeys(t *testing.T) {
	long := strings.Repeat("k", 255)
	bad := map[string]string{
		"empty":     "",
		"256 bytes": long + "k",
		"space":     "has space",
		"non-ASCII": "caf\u00e9",
		"control":   "tab\there",
		"DEL":       "del\x7f",
	}
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		for name, key := range bad {
			// One open transaction at a time: on SQLite a second waits for
			// the first's write lock.
			tx, n := counted(e.begin(nil))
			_, err := s.Do(ctx, tx, charge(key, "100"), func(context.Context) (idem.Response, error) {
				t.Errorf("%s: fn ran", name)
				return idem.Response{StatusCode: 200}, nil
			})
			if !errors.Is(err, idem.ErrInvalidKey) || n.Load() != 0 {
				t.Errorf("%s key: err = %v after %d statements; want ErrInvalidKey after none", name, err, n.Load())
			}
			must(t, tx.Rollback())
		}
		distinct := []idem.Request{
			charge(long[:254]+"a", "100"), charge(long[:254]+"b", "100"),
			charge("abc", "100"), charge("ABC", "100"),
		}
		scoped := charge("scope-key", "100")
		scoped.Scope = "tenant"
		padded := scoped
		padded.Scope = "tenant "
		distinct = append(distinct, scoped, padded)
		for _, r := range distinct {
			res, err := o.do(s, r)
			must(t, err)
			if res.Replayed {
				t.Errorf("scope %q key %q replayed another key's result", r.Scope, r.Key)
			}
		}
		if n := e.int64("SELECT COUNT(*) FROM " + o.biz); n != int64(len(distinct)) {
			t.Fatalf("%d business rows, want %d", n, len(distinct))
		}
	})
}

// 8. A caller whose snapshot predates the winner's commit still sees it:
// a replay on MySQL, a retryable error on Postgres and SQLite (which
// RunTx turns into a replay): SnapshotRetryable.
func testOldSnapshotSeesWinner(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("snapshot", "100")
		tx := e.oldSnapshot()
		var n int
		must(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+o.biz).Scan(&n)) // takes the snapshot
		_, err := o.do(s, req)
		must(t, err)
		res, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
		switch {
		case e.SnapshotRetryable && !idem.IsRetryable(err):
			t.Fatalf("Do with an old snapshot: %v (replayed %v), want a retryable error", err, res.Replayed)
		case e.SnapshotRetryable:
		case err != nil:
			t.Fatalf("Do with an old snapshot: %v", err)
		case !res.Replayed:
			t.Fatalf("Do with an old snapshot ran fn again")
		}
		if calls := o.calls.Load(); calls != 1 {
			t.Fatalf("fn ran %d times, want 1", calls)
		}
		_ = tx.Rollback()
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want 1", n)
		}
	})
}

// oldSnapshot begins a transaction whose snapshot, taken at its first
// read of a table, can predate another's commit: at REPEATABLE READ, or
// by hand with SnapshotBegin (SQLite's BEGIN DEFERRED). It is rolled
// back at cleanup if it is still open.
func (e *env) oldSnapshot() txn {
	e.t.Helper()
	if e.SnapshotBegin == "" {
		return e.begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	}
	tx := e.beginOn(e.db, e.SnapshotBegin)
	e.t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// connTx is a transaction begun by hand, with a BEGIN statement of the
// test's own (BEGIN DEFERRED on SQLite, whatever the DSN's _txlock, takes
// its snapshot at its first read and the write lock only when it first
// writes), on a connection of its own, which ending it closes. It offers
// the statements of a DBTX but not the *sql.Conn's BeginTx, so that Do
// accepts it as a transaction.
type connTx struct{ conn *sql.Conn }

func (c connTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return c.conn.ExecContext(ctx, q, args...)
}

func (c connTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return c.conn.QueryContext(ctx, q, args...)
}

func (c connTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return c.conn.QueryRowContext(ctx, q, args...)
}

func (c connTx) Commit() error   { return c.end("COMMIT") }
func (c connTx) Rollback() error { return c.end("ROLLBACK") }

func (c connTx) end(statement string) error {
	_, err := c.conn.ExecContext(ctx, statement)
	return errors.Join(err, c.conn.Close())
}

// beginOn begins a transaction with the statement begin on a connection
// of db's own: a database/sql pool's (SQL), as the test skips elsewhere.
func (e *env) beginOn(db pool, begin string) txn {
	e.t.Helper()
	p, ok := db.(*sqlPool)
	if !ok {
		e.t.Skipf("%s runs idem through its Runner, not database/sql: this test begins a transaction with %s on a *sql.Conn", e.Name, begin)
	}
	conn, err := p.db.Conn(ctx)
	must(e.t, err)
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		_ = conn.Close()
		e.t.Fatalf("%s: %v", begin, err)
	}
	return sqlTxn(connTx{conn})
}

// 9. A *sqlx.Tx is a DBTX; a nil one is refused as an untyped nil is.
func testSqlxTx(t *testing.T) {
	forEachSQL(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("sqlx", "100")
		if _, err := s.Store.Do(ctx, (*sqlx.Tx)(nil), req, ok); err == nil || err.Error() != "idem: Do needs an open transaction, got nil" {
			t.Errorf("Do with a nil *sqlx.Tx: %v, want the untyped nil's refusal", err)
		}
		sqlxTx, err := sqlx.NewDb(e.sqlDB(), e.sqlDriver()).Beginx()
		must(t, err)
		tx := sqlTxn(sqlxTx)
		defer tx.Rollback()
		res, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
		must(t, err)
		must(t, tx.Commit())
		if res.Replayed || e.count(o.biz, req.Key) != 1 || e.records(s, req.Key) != 1 {
			t.Fatalf("Do through *sqlx.Tx did not commit its record and row")
		}
	})
}

// 10. A PROCESSING record with a live lease is in flight; with an expired
// lease it is taken over and its token grows.
func testLeftClaim(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("left-claim", "100")
		left := time.Now()
		e.leaveClaim(s, req, 90*time.Second)
		_, err := o.do(s, req)
		wantLeaseLeft(t, err, 90*time.Second, left)

		tokenBefore := e.token(s, req.Key)
		e.leaveClaim(s, charge("other", "1"), 0) // unrelated; keeps the clock moving
		e.expire(s, req.Key)
		res, err := o.do(s, req)
		must(t, err)
		if res.Replayed || o.calls.Load() != 1 {
			t.Fatalf("expired claim was not taken over: %+v calls=%d", res, o.calls.Load())
		}
		if after := e.token(s, req.Key); after <= tokenBefore {
			t.Fatalf("token %d after takeover, want more than %d", after, tokenBefore)
		}
	})
}

// 11. Oversize or NUL-holding fields are ErrInvalidRequest naming the
// field, and a bad table name is an error, all before any statement.
func testInvalidRequests(t *testing.T) {
	long := strings.Repeat("x", 256)
	cases := map[string]func(*idem.Request){
		"Scope":       func(r *idem.Request) { r.Scope = long },
		"Operation":   func(r *idem.Request) { r.Operation = long },
		"Fingerprint": func(r *idem.Request) { r.Fingerprint = long[:129] },
	}
	nul := map[string]func(*idem.Request){
		"Scope":     func(r *idem.Request) { r.Scope = "ten\x00ant" },
		"Operation": func(r *idem.Request) { r.Operation = "POST\x00" },
	}
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		for _, set := range []map[string]func(*idem.Request){cases, nul} {
			for field, mutate := range set {
				req := charge("invalid", "100")
				mutate(&req)
				tx, n := counted(e.begin(nil)) // one open at a time, as in TestKeys
				_, err := s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
					t.Errorf("%s: fn ran", field)
					return idem.Response{StatusCode: 200}, nil
				})
				if !errors.Is(err, idem.ErrInvalidRequest) || !strings.Contains(err.Error(), field) || n.Load() != 0 {
					t.Errorf("bad %s: err = %v after %d statements; want ErrInvalidRequest naming it, before any statement", field, err, n.Load())
				}
				must(t, tx.Rollback())
			}
		}
		for _, name := range []string{"keys; DROP TABLE users", `"quoted"`, "a.b.c", "1table", "", "tab le", strings.Repeat("t", 49)} {
			if bad, err := idem.New(e.Dialect, idem.WithTable(name)); err == nil || bad != nil || !strings.Contains(err.Error(), "table name") {
				t.Errorf("New with table %q: %v, %v; want no Store and an error naming the table", name, bad, err)
			}
		}
	})
}

// 12. A key past retention is forgotten and may be reused with any payload.
// The record is moved back past retention on the database's clock rather
// than waited out, so a stalled machine cannot make it expire early.
func testRetention(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithRetention(time.Hour)), e.op()
		req := charge("retention", "100")
		_, err := o.do(s, req)
		must(t, err)
		e.age(s, req.Key, time.Hour-time.Minute)
		res, err := o.do(s, req)
		must(t, err)
		if !res.Replayed {
			t.Fatalf("within retention: not replayed")
		}
		e.age(s, req.Key, time.Minute)
		res, err = o.do(s, charge(req.Key, "999"))
		must(t, err)
		if res.Replayed || o.calls.Load() != 2 || e.records(s, req.Key) != 1 {
			t.Fatalf("past retention: replayed=%v calls=%d; want a fresh execution", res.Replayed, o.calls.Load())
		}
	})
}

// 13. idem leaves the session as it found it: LAST_INSERT_ID(), the
// isolation level and session settings, in a transaction at each level
// the database begins.
func testSessionUntouched(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		for _, level := range isolationLevels {
			t.Run(levelName(level), func(t *testing.T) {
				e := e.in(t)
				e.skipLevel(level)
				for _, path := range []string{"fresh", "replay"} {
					req := charge("session-"+levelName(level), "100")
					tx := e.begin(&sql.TxOptions{Isolation: level})
					must(t, e.insertRow(tx, o.biz, "before", path))
					var before, after string
					must(t, tx.QueryRow(e.SessionProbe).Scan(&before))
					_, err := s.Do(ctx, tx, req, ok)
					must(t, err)
					must(t, tx.QueryRow(e.SessionProbe).Scan(&after))
					must(t, tx.Commit())
					if before != after {
						t.Fatalf("%s: session was %q before Do and %q after", path, before, after)
					}
				}
			})
		}
	})
}

// freshStatements is what Do runs on a fresh key beside fn's, on every
// database: the claim, whose token Do chose, so that no statement reads it
// back, and the response stored, fenced on that token.
const freshStatements = 2

// The documented statement counts beyond the caller's own: on the fresh
// path freshStatements, one on the replay path of a Store that has
// seen the key completed (the record read), two on the replay and
// in-flight paths of another (the claim, then the existing record read);
// on every path SettingsCheck more before the claim (TiDB's check of the
// transaction's settings). On the fresh path no statement reads the
// record back: not the claim (RETURNING), nor a SELECT of the table.
func testStatementCounts(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		req, held := charge("counted", "100"), charge("held", "100")
		e.leaveClaim(s, held, time.Minute)
		fresh, check := int64(freshStatements), e.SettingsCheck
		other := e.elsewhere(s) // another process's Store: it has not seen the key completed
		for _, want := range []struct {
			path  string
			store *store
			req   idem.Request
			n     int64
			err   error
		}{
			{"fresh", s, req, check + fresh, nil},
			{"replay", s, req, check + 1, nil},
			{"replay in another process", other, req, check + 2, nil},
			{"in-flight", other, held, check + 2, idem.ErrInFlight},
		} {
			var sent []string
			tx := e.begin(nil).watched(func(q string) { sent = append(sent, q) })
			_, err := want.store.Do(ctx, tx, want.req, ok)
			if !errors.Is(err, want.err) {
				t.Fatalf("%s path: %v, want %v", want.path, err, want.err)
			}
			must(t, tx.Commit())
			if int64(len(sent)) != want.n {
				t.Errorf("%s path ran %d statements, want %d", want.path, len(sent), want.n)
			}
			for _, q := range sent {
				if want.path == "fresh" && (strings.Contains(q, "RETURNING") || strings.HasPrefix(q, "SELECT") && strings.Contains(q, s.Table())) {
					t.Errorf("fresh path read the record back:\n%s", q)
				}
			}
		}
	})
}

// A Store reads the record of a key it has seen completed before it claims
// the key (a hint, so that a replay is one read). The read decides: the
// replay, a mismatch, and a key whose record is gone or past retention all
// come out as they do for a Store that has not seen the key.
func testCompletedKeyHint(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s, o := e.store(idem.WithRetention(retention)), e.op()
		other := e.elsewhere(s, idem.WithRetention(retention))
		req := charge("hinted", "100")
		first, err := o.do(s, req)
		must(t, err)
		for name, st := range map[string]*store{"this process": s, "another process": other} {
			res, err := o.do(st, req)
			must(t, err)
			if !res.Replayed || !bytes.Equal(res.Body, first.Body) {
				t.Fatalf("replay in %s: %+v, want the first response replayed", name, res)
			}
			changed := req
			changed.Fingerprint = idem.Fingerprint([]byte("amount=200"))
			if _, err := o.do(st, changed); !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("another payload in %s: %v, want ErrMismatch", name, err)
			}
		}
		if n := o.calls.Load(); n != 1 {
			t.Fatalf("%d executions before the record went, want 1", n)
		}

		e.exec("DELETE FROM "+s.Table()+" WHERE idem_key = ?", req.Key)
		if res, err := o.do(s, req); err != nil || res.Replayed {
			t.Fatalf("a hinted key whose record is gone: %+v, %v; want a fresh execution", res, err)
		}
		e.age(s, req.Key, retention+time.Minute)
		if res, err := o.do(s, req); err != nil || res.Replayed {
			t.Fatalf("a hinted key past retention: %+v, %v; want a fresh execution", res, err)
		}
		if n, rows := o.calls.Load(), e.count(o.biz, req.Key); n != 3 || rows != 3 {
			t.Fatalf("%d executions and %d business rows, want 3 of each", n, rows)
		}
	})
}

// A Store asked for keys it has not served (another instance's, or a
// client that retries without saying so), most of which turn out to be
// replays, reads such a key first, as a hinted one, where that read locks
// nothing (PostgreSQL): a replay is then one statement, the read. Once
// fresh keys are the most again it claims first again, and a fresh key
// costs freshStatements. On the other dialects it always claims first.
// The read decides: every replay replays, and no fresh key does.
func testReadFirstWhileReplaying(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const keys = 100
		s, o := e.store(), e.op()
		for i := range keys {
			_, err := o.do(s, charge(fmt.Sprintf("replayed-%d", i), "100"))
			must(t, err)
		}
		other := e.elsewhere(s)
		run := func(req idem.Request) (bool, int64) {
			var sent []string
			tx := e.begin(nil).watched(func(q string) { sent = append(sent, q) })
			res, err := other.Do(ctx, tx, req, ok)
			must(t, err)
			must(t, tx.Commit())
			return res.Replayed, int64(len(sent))
		}
		claimFirst, readFirst, fresh := e.SettingsCheck+2, e.SettingsCheck+1, e.SettingsCheck+freshStatements
		if !e.ReadFirstLocksNothing {
			readFirst = claimFirst
		}
		counts := make([]int64, keys)
		for i := range keys {
			replayed, n := run(charge(fmt.Sprintf("replayed-%d", i), "100"))
			if !replayed {
				t.Fatalf("completed key %d did not replay", i)
			}
			counts[i] = n
		}
		if counts[0] != claimFirst || counts[keys-1] != readFirst {
			t.Errorf("replays ran %v statements, want %d first and %d last", counts, claimFirst, readFirst)
		}
		for i := range keys {
			replayed, n := run(charge(fmt.Sprintf("fresh-%d", i), "100"))
			if replayed {
				t.Fatalf("fresh key %d replayed", i)
			}
			counts[i] = n
		}
		if first := fresh + claimFirst - readFirst; counts[0] != first || counts[keys-1] != fresh {
			t.Errorf("fresh keys ran %v statements, want %d first and %d last", counts, first, fresh)
		}
	})
}

// Migrate is safe to repeat, and a schema-qualified table name works.
func testMigrate(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		must(t, s.Migrate(ctx, e.db))

		qualified := e.qualifiedTable()
		iq, err := idem.New(e.Dialect, idem.WithTable(qualified))
		must(t, err)
		q := e.onDriver(iq)
		must(t, q.Migrate(ctx, e.db))
		must(t, q.Migrate(ctx, e.db))
		res, err := e.do(q, charge("qualified", "1"), func(handle) func(context.Context) (idem.Response, error) {
			return func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 204}, nil }
		})
		must(t, err)
		if res.StatusCode != 204 {
			t.Fatalf("Do on %s: %+v", qualified, res)
		}
	})
}

// qualifiedTable is a fresh table's name qualified with a schema
// (Facts.QualifiedTable), dropped when the test ends.
func (e *env) qualifiedTable() string {
	e.t.Helper()
	e.needFact("QualifiedTable", e.QualifiedTable != nil)
	table, drop, err := e.QualifiedTable(ctx, e.db.runner(nil))
	must(e.t, err)
	e.t.Cleanup(func() {
		if _, err := e.db.Exec(drop); err != nil {
			e.t.Errorf("%s: %v", drop, err)
		}
	})
	return table
}

// pgQualifiedTable is a table in a schema of the test's own, dropped with
// its tables; its name has capitals, which idem quotes.
func pgQualifiedTable(ctx context.Context, db idem.Conn) (table, drop string, err error) {
	schemaName := randName("s")
	if _, err := db.Exec(ctx, idem.Query{SQL: "CREATE SCHEMA " + schemaName}); err != nil {
		return "", "", err
	}
	return schemaName + ".Keys", "DROP SCHEMA " + schemaName + " CASCADE", nil
}

// mysqlQualifiedTable is a table in the connection's database, named
// with it.
func mysqlQualifiedTable(ctx context.Context, db idem.Conn) (table, drop string, err error) {
	var database string
	if err := db.QueryRow(ctx, idem.Query{SQL: "SELECT DATABASE()"}, &database); err != nil {
		return "", "", err
	}
	table = database + "." + randName("idem")
	return table, "DROP TABLE IF EXISTS " + table, nil
}

// On Postgres a replay writes nothing: the transaction gets no transaction
// id, so its commit needs no WAL flush and hot keys replay in parallel.
func testPostgresReplayWritesNothing(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		s := e.store()
		req := charge("read-only-replay", "100")
		_, err := e.do(s, req, func(handle) func(context.Context) (idem.Response, error) { return ok })
		must(t, err)
		tx := e.begin(nil)
		res, err := s.Do(ctx, tx, req, ok)
		must(t, err)
		var xid sql.NullInt64
		must(t, tx.QueryRow("SELECT txid_current_if_assigned()").Scan(&xid))
		if !res.Replayed || xid.Valid {
			t.Fatalf("replayed=%v, transaction id %v; want a replay that assigned none", res.Replayed, xid)
		}
	})
}

// Do and Claim.Complete take only a handle inside a transaction: every
// pool and connection of the target's driver (and a wrapper of one) is
// refused before any statement, with a message that says what to pass
// instead, since its statements would commit one by one and the record
// would commit apart from the business rows. Two of them were accepted
// before, and autocommitted the claim: a wrapper shaped like GORM's
// prepared pool (*gorm.PreparedStmtDB embeds the pool, and its BeginTx
// returns an interface, not a *sql.Tx) and one that forwards DBTX's
// methods to a pool. Through a Runner the refusal is the compiler's: DoOn
// and CompleteOn take an idem.Tx, which a driver's adapter makes of its
// transaction only (idempgx.Tx of a pgx.Tx), and none of the driver's
// pools and connections (Outsider: pgx's) is a transaction.
// contrib/idemgorm and contrib/idembun refuse the ORMs' own pools.
func testOnlyTransactionsAccepted(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		req := charge("not-a-tx", "1")
		c := mustClaim(t, s, e.db, req)
		for name, h := range e.db.outside(t) {
			h, isSQL := h.(idem.DBTX)
			if !isSQL {
				if _, isTx := h.(interface{ Commit(context.Context) error }); isTx {
					t.Errorf("%s is a transaction: the driver's adapter takes it where DoOn and CompleteOn want one", name)
				}
				continue
			}
			if _, err := s.Store.Do(ctx, h, charge("do-outside", "1"), ok); err == nil || !strings.Contains(err.Error(), "needs an open transaction") || !strings.Contains(err.Error(), "pass ") {
				t.Errorf("Do on %s: err = %v, want a refusal that asks for an open transaction and says what to pass", name, err)
			}
			if err := c.Claim.Complete(ctx, h, idem.Response{StatusCode: 201}); err == nil || !strings.Contains(err.Error(), "needs an open transaction") || !strings.Contains(err.Error(), "pass ") {
				t.Errorf("Complete on %s: err = %v, want a refusal that asks for an open transaction and says what to pass", name, err)
			}
		}
		if n := e.records(s, "do-outside"); n != 0 {
			t.Errorf("%d records after refused calls to Do, want 0", n)
		}
		if rec, err := s.Inspect(ctx, e.db, req.Scope, req.Key); err != nil || rec == nil || rec.Status != idem.StatusProcessing {
			t.Errorf("after refused calls to Complete: record %+v (%v), want the claim still processing", rec, err)
		}
		if _, err := s.Do(ctx, nil, req, ok); err == nil {
			t.Errorf("Do with a nil tx: no error")
		}
		tx, n := counted(e.begin(nil))
		if _, err := s.Do(ctx, tx, req, nil); err == nil || n.Load() != 0 {
			t.Errorf("Do with a nil fn: err = %v after %d statements", err, n.Load())
		}
		must(t, tx.Commit())
		if _, err := s.Do(ctx, tx, charge("committed", "1"), ok); err == nil {
			t.Errorf("Do on a committed transaction: no error")
		}
		if n := e.records(s, "committed"); n != 0 {
			t.Errorf("%d records after Do on a committed transaction, want 0", n)
		}
	})
}
