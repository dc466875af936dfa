package conformance

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
)

// The MySQL driver logs every connection the faults break (to stderr,
// beside returning the error); the tests check the errors themselves.
func init() { _ = mysql.SetLogger(log.New(io.Discard, "", 0)) }

// sessionID is the server's id of the session behind db (a transaction or
// a connection).
func (e *env) sessionID(db handle) (int64, error) {
	var id int64
	err := db.QueryRowContext(ctx, e.SessionQuery).Scan(&id)
	return id, err
}

// killSession ends the session id from another connection, as a crash of
// its client or an operator would, and waits until the server has rolled
// back its transaction and let it go.
func (e *env) killSession(id int64) error {
	if _, err := e.db.ExecContext(ctx, e.KillQuery(id)); err != nil {
		return fmt.Errorf("kill session %d: %w", id, err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := e.db.QueryRowContext(ctx, e.rebind(e.AliveQuery), id).Scan(&n); err != nil {
			return fmt.Errorf("wait for session %d to end: %w", id, err)
		}
		if n == 0 {
			return nil
		}
	}
	return fmt.Errorf("session %d still there 10s after it was killed", id)
}

// Fault 1: the session dies mid-Do. Its transaction rolls back: no record,
// no business row, and the retry runs fn once. A duplicate that was waiting
// for the dead session goes on and runs fn itself.
func testKillMidDo(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e.needServer("server session")
		e.needFact("KillQuery", e.KillQuery != nil && e.SessionQuery != "" && e.AliveQuery != "")
		e = e.onOneNode()
		s, o := e.store(), e.op()
		req := charge("killed", "100")
		tx := e.begin(nil)
		id, err := e.sessionID(tx)
		must(t, err)
		_, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			must(t, e.killSession(id))
			return o.fn(tx, req.Key)(ctx)
		})
		if err == nil {
			t.Fatalf("Do on a killed session: no error")
		}
		if err := tx.Commit(); err == nil {
			t.Fatalf("Commit on a killed session: no error")
		}
		if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 0 || r != 0 {
			t.Fatalf("after the kill: %d business rows, %d records; want 0, 0", n, r)
		}
		res, err := o.do(s, req)
		must(t, err)
		if res.Replayed || o.calls.Load() != 2 || e.count(o.biz, req.Key) != 1 {
			t.Fatalf("retry: replayed=%v calls=%d rows=%d; want one more execution, one row", res.Replayed, o.calls.Load(), e.count(o.biz, req.Key))
		}

		// The holder dies while a duplicate waits for it.
		held := charge("killed-holder", "100")
		holder := e.begin(nil)
		id, err = e.sessionID(holder)
		must(t, err)
		_, err = s.Do(ctx, holder, held, o.fn(holder, held.Key))
		must(t, err)
		type outcome struct {
			res idem.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := o.do(s, held)
			done <- outcome{res, err}
		}()
		waitBlocked(e, s.Table(), done)
		must(t, e.killSession(id))
		out := <-done
		must(t, out.err)
		if out.res.Replayed || e.count(o.biz, held.Key) != 1 || e.records(s, held.Key) != 1 {
			t.Fatalf("duplicate after the holder died: %+v, %d rows; want its own execution, one row", out.res, e.count(o.biz, held.Key))
		}
	})
}

// Fault 2: the COMMIT, or the reply to it, is lost on the way. The client
// cannot know whether it committed; its retry replays (it did) or runs (it
// did not), and the business table ends with exactly one row either way.
// The same holds for Begin's own COMMIT: a claim nobody holds blocks the
// key until its lease ends (ended here by moving it back on the database's
// clock), then is taken over.
func testLostCommit(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e.needServer("network connection")
		s, o := e.store(idem.WithLease(time.Minute)), e.op()
		p := e.startProxy()
		db := p.open(e, 2)
		for _, c := range []struct {
			name   string
			mode   int32
			replay bool
		}{{"reply-lost", loseCommitReply, true}, {"commit-lost", loseCommit, false}} {
			req := charge("lost-"+c.name, "100")
			p.arm(c.mode)
			tx := e.beginIn(db, nil)
			first, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
			must(t, err)
			if err := tx.Commit(); err == nil {
				t.Fatalf("%s: Commit through a cut connection: no error", c.name)
			}
			var retry idem.Result
			err = runTx(ctx, db, nil, func(tx txn) error {
				var err error
				retry, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
				return err
			})
			must(t, err)
			if retry.Replayed != c.replay {
				t.Fatalf("%s: retry replayed=%v, want %v", c.name, retry.Replayed, c.replay)
			}
			if c.replay && string(retry.Body) != string(first.Body) {
				t.Fatalf("%s: replayed %q, the lost commit produced %q", c.name, retry.Body, first.Body)
			}
			if n := e.count(o.biz, req.Key); n != 1 {
				t.Fatalf("%s: %d business rows, want 1", c.name, n)
			}
		}

		req := charge("lost-begin", "100")
		p.arm(loseCommitReply)
		begun := time.Now()
		if c, r, err := s.Begin(ctx, db, req); err == nil {
			t.Fatalf("Begin through a cut connection: claim %v replay %v, no error", c, r)
		}
		_, _, err := s.Begin(ctx, db, req)
		wantLeaseLeft(t, err, time.Minute, begun)
		e.expire(s, req.Key)
		c := mustClaim(t, s, db, req)
		must(t, e.complete(c, o.biz, req.Key, "after-lost-begin"))
		if n := e.count(o.biz, req.Key); n != 1 || p.cuts.Load() != 3 {
			t.Fatalf("%d business rows, %d cuts; want 1 and 3", n, p.cuts.Load())
		}
	})
}

// Fault 3: the process crashes after Begin. Until the lease ends a retry
// is told 409 with RetryAfter; after it (ended here by moving it back on
// the database's clock, not by waiting), the retry takes over; the crashed
// claim's late Complete is fenced out and its business row never commits.
func testCrashAfterBegin(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(time.Minute)), e.op()
		req := charge("crashed", "100")
		begun := time.Now()
		crashed := mustClaim(t, s, e.db, req)
		_, err := o.do(s, req)
		wantLeaseLeft(t, err, time.Minute, begun)
		_, _, err = s.Begin(ctx, e.db, req)
		wantLeaseLeft(t, err, time.Minute, begun)

		e.expire(s, req.Key) // the lease ends, by the database's clock
		res, err := o.do(s, req)
		must(t, err)
		if res.Replayed || o.calls.Load() != 1 {
			t.Fatalf("retry after the lease: %+v calls %d; want a takeover", res, o.calls.Load())
		}
		wantLeaseLost(t, e.complete(crashed, o.biz, req.Key, "zombie"), "taken over")
		if n, z := e.count(o.biz, req.Key), e.int64("SELECT COUNT(*) FROM "+o.biz+" WHERE v = 'zombie'"); n != 1 || z != 0 {
			t.Fatalf("%d business rows, %d of them the zombie's; want 1 and 0", n, z)
		}
	})
}

// hooked returns tx with before() run once, just before the first
// statement run through it that starts with prefix (past a setting for
// that statement alone: statement), whether it is run as
// an exec or a query (a takeover that returns the token it wrote is a
// query).
func hooked(tx txn, prefix string, before func()) txn {
	var once sync.Once
	return tx.watched(func(q string) {
		if strings.HasPrefix(statement(q), prefix) {
			once.Do(before)
		}
	})
}

// statement is q from its statement on: past a MariaDB executable
// comment (/*M! ... */) and a SET STATEMENT ... FOR clause, in which
// idem's dialects set a variable for one statement (on Galera: causal
// reads, and the claim replicated on its own).
func statement(q string) string {
	q = strings.TrimSpace(q)
	if strings.HasPrefix(q, "/*M!") {
		if i := strings.Index(q, "*/"); i >= 0 {
			q = strings.TrimSpace(q[i+2:])
		}
	}
	if strings.HasPrefix(q, "SET STATEMENT ") {
		if i := strings.Index(q, " FOR "); i >= 0 {
			q = strings.TrimSpace(q[i+len(" FOR "):])
		}
	}
	return q
}

// Fault 4: the old owner completes between the new owner's read of the
// expired claim and its takeover. Exactly one result wins and the loser is
// told: where the read locks nothing (Postgres) the takeover finds the
// claim completed and replays it; where it locks the record (ReadLocks:
// MySQL) the two collide, and whichever the deadlock detector rolls back
// retries and is told (a replay, or ErrLeaseLost). The reverse order, a
// Complete arriving while a takeover is uncommitted, waits for it and gets
// ErrLeaseLost.
func testCompleteBetweenReadAndWrite(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e = e.onOneNode()
		s, o := e.store(), e.op()
		req := charge("interleaved", "100")
		old := mustClaim(t, s, e.db, req)
		e.expire(s, req.Key)

		oldDone := make(chan error, 1)
		tx := e.begin(nil)
		h := hooked(tx, "UPDATE", func() {
			go func() { oldDone <- e.complete(old, o.biz, req.Key, "old") }()
			if !e.ReadLocks {
				// Nothing holds the row: the old owner commits first.
				must(t, <-oldDone)
				oldDone <- nil
				return
			}
			waitBlocked(e, s.Table(), oldDone) // it queues behind our read lock
		})
		res, err := s.Do(ctx, h, req, o.fn(tx, req.Key))
		newWon := false
		switch {
		case err == nil:
			must(t, tx.Commit())
			newWon = !res.Replayed
			if res.Replayed && string(res.Body) != "old" {
				t.Fatalf("replayed %q, want the old owner's result", res.Body)
			}
		case idem.IsRetryable(err):
			must(t, tx.Rollback())
		default:
			t.Fatalf("Do: %v", err)
		}
		if !e.ReadLocks && (err != nil || !res.Replayed) {
			t.Fatalf("a takeover whose read locks nothing: Do = %+v, %v; want the replay of the completion that won", res, err)
		}
		oldErr := <-oldDone
		if idem.IsRetryable(oldErr) {
			oldErr = e.complete(old, o.biz, req.Key, "old") // its RunTx would retry
		}
		if newWon {
			wantLeaseLost(t, oldErr, "taken over")
		} else {
			must(t, oldErr)
		}
		if err != nil {
			res, err = o.do(s, req)
			must(t, err)
			if !res.Replayed {
				t.Fatalf("the new owner's retry ran again; want the replay")
			}
		}
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want exactly 1", n)
		}

		// Reverse: the takeover is uncommitted when the old owner completes.
		req = charge("interleaved-2", "100")
		old = mustClaim(t, s, e.db, req)
		e.expire(s, req.Key)
		tx = e.begin(nil)
		res, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			go func() { oldDone <- e.complete(old, o.biz, req.Key, "old") }()
			waitBlocked(e, s.Table(), oldDone)
			return o.fn(tx, req.Key)(ctx)
		})
		must(t, err)
		must(t, tx.Commit())
		wantLeaseLost(t, <-oldDone, "taken over")
		if res.Replayed || e.count(o.biz, req.Key) != 1 {
			t.Fatalf("takeover: %+v, %d business rows; want its own execution and one row", res, e.count(o.biz, req.Key))
		}
	})
}
