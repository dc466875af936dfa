package conformance

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// A request that says it is a retry (idem.WithRetryHint), as idemhttp
// marks one that idemclient resends, is read before it is claimed: through
// a Store that has not served the key (another instance), the replay of a
// completed key is then one statement. The hint is never trusted. Under
// each isolation level, a hinted Do or Begin of a key that is new, in
// flight (a live claim of Begin's, or a Do whose transaction is open),
// whose lease ran out, that was released, that is past retention, or of
// another payload, and one whose transaction read before another instance
// completed the key, comes out as it does without the hint: the same
// result, fn run as often, the same business rows. A wrong hint costs one
// read.
func testRetryHint(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, level := range isolationLevels {
			t.Run(levelName(level), func(t *testing.T) {
				e := e.in(t)
				e.skipLevel(level)
				h := e.hinting(level)

				fresh := charge("hinted-fresh", "100")
				res, n, err := h.do(h.other(), fresh)
				must(t, err)
				if res.Replayed || h.o.calls.Load() != 1 {
					t.Fatalf("a new key, hinted: %+v, fn ran %d times; want one execution", res, h.o.calls.Load())
				}
				if want := e.SettingsCheck + 1 + freshStatements + 1; n != want {
					t.Errorf("a new key, hinted: %d statements, want %d (the read, the fresh path and fn's row)", n, want)
				}
				res, n, err = h.do(h.other(), fresh)
				must(t, err)
				if !res.Replayed || h.o.calls.Load() != 1 {
					t.Fatalf("a completed key, hinted, in another Store: %+v, fn ran %d times; want a replay", res, h.o.calls.Load())
				}
				if want := e.SettingsCheck + 1; n != want {
					t.Errorf("a completed key, hinted, in another Store: %d statements, want %d (the read)", n, want)
				}
				changed := fresh
				changed.Fingerprint = idem.Fingerprint([]byte("amount=200"))
				if _, _, err := h.do(h.other(), changed); !errors.Is(err, idem.ErrMismatch) {
					t.Fatalf("another payload, hinted: %v, want ErrMismatch", err)
				}
				if c, replay, err := h.other().Begin(h.ctx, e.db, fresh); err != nil || c != nil || replay == nil || !replay.Replayed {
					t.Fatalf("Begin of a completed key, hinted, in another Store: claim %v, replay %v, %v; want the replay", c, replay, err)
				}
				if c, replay, err := h.other().Begin(h.ctx, e.db, charge("hinted-begin", "100")); err != nil || c == nil || replay != nil {
					t.Fatalf("Begin of a new key, hinted: claim %v, replay %v, %v; want a claim", c, replay, err)
				}

				held := charge("hinted-held", "100")
				mustClaim(t, h.s, e.db, held)
				_, _, err = h.do(h.other(), held)
				wantInFlight(t, err, time.Second, idem.DefaultLease)
				e.expire(h.s, held.Key)
				h.wantRun(held, "a claim whose lease ran out")
				released := charge("hinted-released", "100")
				must(t, mustClaim(t, h.s, e.db, released).Release(ctx, e.db))
				h.wantRun(released, "a released claim")
				e.age(h.s, fresh.Key, h.retention+time.Minute)
				h.wantRun(changed, "a record past retention, with another payload")

				h.wantWaits("hinted-holder-commits", true)
				h.wantWaits("hinted-holder-rolls-back", false)
				if !e.embedded() {
					// A SQLite transaction of the suite holds the write
					// lock from its BEGIN, so no other instance completes
					// the key while it is open; TestOldSnapshotSeesWinner
					// has SQLite's deferred transaction.
					h.oldSnapshot(charge("hinted-snapshot", "100"))
				}
			})
		}
	})
}

// hinting runs hinted requests at one isolation level, each through a
// Store of its own that has served no key, on one table, with one
// operation.
type hinting struct {
	e         *env
	s         *store // the first instance's Store
	o         *op
	opts      *sql.TxOptions
	ctx       context.Context // carries the retry hint
	retention time.Duration
}

func (e *env) hinting(level sql.IsolationLevel) *hinting {
	const retention = time.Hour
	return &hinting{e: e, s: e.store(idem.WithRetention(retention)), o: e.op(), opts: &sql.TxOptions{Isolation: level},
		ctx: idem.WithRetryHint(ctx), retention: retention}
}

// other is a Store on h's table that has served no key: another instance.
func (h *hinting) other() *store { return h.e.elsewhere(h.s, idem.WithRetention(h.retention)) }

// do runs a hinted Do of req with h's operation through s, in a
// transaction at h's level, retried as RunTx retries, and returns the
// statements of the last attempt, fn's own included.
func (h *hinting) do(s *store, req idem.Request) (idem.Result, int64, error) {
	var (
		res idem.Result
		n   *atomic.Int64
	)
	err := runTx(h.ctx, h.e.db, h.opts, func(tx txn) error {
		tx, n = counted(tx)
		var err error
		res, err = s.Do(h.ctx, tx, req, h.o.fn(tx, req.Key))
		return err
	})
	return res, n.Load(), err
}

// wantRun checks that a hinted Do of req, whose record is there but free
// (what says how), runs h's operation once, as it would unhinted.
func (h *hinting) wantRun(req idem.Request, what string) {
	h.e.t.Helper()
	calls, rows := h.o.calls.Load(), h.e.count(h.o.biz, req.Key)
	res, _, err := h.do(h.other(), req)
	if err != nil || res.Replayed || h.o.calls.Load() != calls+1 {
		h.e.t.Fatalf("%s, hinted: %+v, %v, fn ran %d times; want it to run once", what, res, err, h.o.calls.Load()-calls)
	}
	if n := h.e.count(h.o.biz, req.Key); n != rows+1 {
		h.e.t.Fatalf("%s, hinted: %d business rows more, want 1", what, n-rows)
	}
}

// wantWaits has a Do of key hold its claim in an open transaction at h's
// level while a hinted Do of the key begins in another instance, then
// commits that transaction (commit) or rolls it back, and checks that the
// hinted one waited for it and then replayed its response, or ran the
// operation itself.
func (h *hinting) wantWaits(key string, commit bool) {
	e := h.e
	e.t.Helper()
	req := charge(key, "100")
	holder := e.begin(h.opts)
	first, err := h.s.Do(ctx, holder, req, h.o.fn(holder, req.Key))
	must(e.t, err)
	type answer struct {
		res idem.Result
		err error
	}
	done, other := make(chan answer, 1), h.other()
	go func() {
		res, _, err := h.do(other, req)
		done <- answer{res, err}
	}()
	waitBlocked(e, h.s.Table(), done)
	if commit {
		must(e.t, holder.Commit())
	} else {
		must(e.t, holder.Rollback())
	}
	a := <-done
	must(e.t, a.err)
	switch {
	case commit && (!a.res.Replayed || string(a.res.Body) != string(first.Body)):
		e.t.Fatalf("hinted behind a claim that committed: %+v, want its response replayed", a.res)
	case !commit && a.res.Replayed:
		e.t.Fatalf("hinted behind a claim that rolled back: %+v, want a fresh execution", a.res)
	}
	if rows := e.count(h.o.biz, req.Key); rows != 1 {
		e.t.Fatalf("hinted behind a claim that committed=%v: %d business rows, want 1", commit, rows)
	}
}

// oldSnapshot checks that a hinted Do in a transaction that read before
// another instance completed req's key replays that instance's response,
// at once or (where the isolation level makes the database abort the
// transaction) on the retry, and never runs the operation again.
func (h *hinting) oldSnapshot(req idem.Request) {
	e := h.e
	e.t.Helper()
	s, untouched := h.other(), e.business()
	var (
		res      idem.Result
		attempts int
	)
	err := runTx(h.ctx, e.db, h.opts, func(tx txn) error {
		attempts++
		// Takes the snapshot; a table no one writes, since under
		// SERIALIZABLE MySQL's read locks what it reads.
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+untouched).Scan(&n); err != nil {
			return err
		}
		if attempts == 1 {
			if _, err := h.o.do(h.s, req); err != nil {
				return err
			}
		}
		var err error
		res, err = s.Do(h.ctx, tx, req, h.o.fn(tx, req.Key))
		return err
	})
	must(e.t, err)
	if !res.Replayed {
		e.t.Fatalf("hinted, in a transaction older than the completion: %+v after %d attempts, want a replay", res, attempts)
	}
	if rows := e.count(h.o.biz, req.Key); rows != 1 {
		e.t.Fatalf("hinted, in a transaction older than the completion: %d business rows, want 1", rows)
	}
}
