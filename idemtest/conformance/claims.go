package conformance

import (
	"database/sql"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// complete runs c.Complete in a business transaction that first inserts a
// row for key (v = tag), and commits it; on any error it rolls back and
// returns the error.
func (e *env) complete(c *claim, biz, key, tag string) error {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := e.insertRow(tx, biz, key, tag); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := c.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte(tag)}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// mustClaim runs Begin and fails unless it returned a claim.
func mustClaim(t *testing.T, s *store, db pool, req idem.Request) *claim {
	t.Helper()
	c, replay, err := s.Begin(ctx, db, req)
	if err != nil || replay != nil || c == nil {
		t.Fatalf("Begin(%q): claim %v, replay %v, err %v; want a claim", req.Key, c, replay, err)
	}
	return c
}

// wantInFlight fails unless err is an *InFlightError with RetryAfter in
// [lo, hi], in whole seconds.
func wantInFlight(t *testing.T, err error, lo, hi time.Duration) {
	t.Helper()
	var inflight *idem.InFlightError
	if !errors.As(err, &inflight) || !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("err = %v, want *InFlightError", err)
	}
	if inflight.RetryAfter < lo || inflight.RetryAfter > hi || inflight.RetryAfter%time.Second != 0 {
		t.Fatalf("RetryAfter = %v, want whole seconds in [%v, %v]", inflight.RetryAfter, lo, hi)
	}
}

// wantLeaseLeft fails unless err is an *InFlightError whose RetryAfter is
// what is left, rounded up to a second, of a lease of d written after
// since: at most d, and at least d less the time since then (which bounds
// the time that passed on the database's clock between the two).
func wantLeaseLeft(t *testing.T, err error, d time.Duration, since time.Time) {
	t.Helper()
	wantInFlight(t, err, ceilSecond(d-time.Since(since)), ceilSecond(d))
}

func ceilSecond(d time.Duration) time.Duration { return (d + time.Second - 1).Truncate(time.Second) }

// wantLeaseLost fails unless err wraps ErrLeaseLost and its message holds
// every one of parts.
func wantLeaseLost(t *testing.T, err error, parts ...string) {
	t.Helper()
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	for _, p := range parts {
		if !strings.Contains(told(err), p) {
			t.Fatalf("ErrLeaseLost %q does not say %q", told(err), p)
		}
	}
}

func (e *env) token(s *store, key string) int64 {
	e.t.Helper()
	return e.int64("SELECT token FROM "+s.Table()+" WHERE idem_key = ?", key)
}

// Begin returns a claim, a replay, ErrMismatch, *InFlightError with the
// lease's remaining time, or ErrInvalidKey/ErrInvalidRequest; Do and Begin
// see each other's claims.
func testBeginOutcomes(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(90*time.Second)), e.op()
		req := charge("begin-1", "100")
		claimed := time.Now()
		c := mustClaim(t, s, e.db, req)
		if c.Token() <= 0 || c.Token() != e.token(s, req.Key) {
			t.Fatalf("Token() = %d, record holds %d", c.Token(), e.token(s, req.Key))
		}

		_, _, err := s.Begin(ctx, e.db, req)
		wantLeaseLeft(t, err, 90*time.Second, claimed)
		_, err = o.do(s, req)
		wantLeaseLeft(t, err, 90*time.Second, claimed)
		if _, _, err := s.Begin(ctx, e.db, charge(req.Key, "999")); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("other payload while claimed: %v, want ErrMismatch", err)
		}

		must(t, e.complete(c, o.biz, req.Key, "paid"))
		for range 2 {
			c2, replay, err := s.Begin(ctx, e.db, req)
			if err != nil || c2 != nil || replay == nil || !replay.Replayed || replay.StatusCode != 201 || string(replay.Body) != "paid" {
				t.Fatalf("Begin after Complete: claim %v replay %+v err %v; want the replay of \"paid\"", c2, replay, err)
			}
		}
		res, err := o.do(s, req)
		must(t, err)
		if !res.Replayed || string(res.Body) != "paid" || o.calls.Load() != 0 {
			t.Fatalf("Do after Complete: %+v, calls %d; want the replay", res, o.calls.Load())
		}
		if _, _, err := s.Begin(ctx, e.db, charge(req.Key, "999")); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("other payload after Complete: %v, want ErrMismatch", err)
		}
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want 1", n)
		}

		// A key Do claimed in an open transaction: Begin waits for it.
		held := charge("begin-2", "100")
		tx := e.begin(nil)
		_, err = s.Do(ctx, tx, held, o.fn(tx, held.Key))
		must(t, err)
		done := make(chan error, 1)
		go func() {
			_, replay, err := s.Begin(ctx, e.db, held)
			if err == nil && (replay == nil || !replay.Replayed) {
				err = fmt.Errorf("Begin after the holder committed: replay %+v, want a replay", replay)
			}
			done <- err
		}()
		waitBlocked(e, s.Table(), done)
		must(t, tx.Commit())
		must(t, <-done)

		for _, key := range []string{"", "has space", strings.Repeat("k", 256)} {
			if c, r, err := s.Begin(ctx, e.db, charge(key, "1")); !errors.Is(err, idem.ErrInvalidKey) || c != nil || r != nil {
				t.Errorf("Begin with key %q: %v, want ErrInvalidKey alone", key, err)
			}
		}
		bad := charge("ok-key", "1")
		bad.Operation = strings.Repeat("x", 256)
		if _, _, err := s.Begin(ctx, e.db, bad); !errors.Is(err, idem.ErrInvalidRequest) || !strings.Contains(err.Error(), "Operation") {
			t.Errorf("Begin with a long Operation: %v, want ErrInvalidRequest naming it", err)
		}
		if _, _, err := s.Begin(ctx, nil, req); err == nil {
			t.Errorf("Begin with a nil pool: no error")
		}
		if r := e.records(s, "ok-key") + e.records(s, ""); r != 0 {
			t.Errorf("%d records for invalid requests", r)
		}
	})
}

// Sixteen takeovers of one expired claim at once: exactly one wins, the
// others are told the key is in flight, and the old claim is fenced out.
func testConcurrentTakeover(t *testing.T) {
	const workers = 16
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("takeover-16", "100")
		old := mustClaim(t, s, e.db, req)
		e.expire(s, req.Key)

		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			claims   []*claim
			inflight int
			errs     []error
		)
		start := make(chan struct{})
		for range workers {
			wg.Go(func() {
				<-start
				c, replay, err := s.Begin(ctx, e.db, req)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, idem.ErrInFlight):
					inflight++
				case err != nil:
					errs = append(errs, err)
				case replay != nil:
					errs = append(errs, fmt.Errorf("unexpected replay %+v", replay))
				default:
					claims = append(claims, c)
				}
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			t.Errorf("Begin: %v", err)
		}
		if len(claims) != 1 || inflight != workers-1 {
			t.Fatalf("%d claims and %d in flight; want 1 and %d", len(claims), inflight, workers-1)
		}
		winner := claims[0]
		if winner.Token() <= old.Token() {
			t.Fatalf("winner's token %d is not larger than the old %d", winner.Token(), old.Token())
		}
		wantLeaseLost(t, e.complete(old, o.biz, req.Key, "old"), "taken over", "roll back")
		must(t, e.complete(winner, o.biz, req.Key, "winner"))
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want 1", n)
		}
	})
}

// Claims of neighbouring keys extended at once, then completed at once
// (each in a transaction with its business row), neither wait for nor
// deadlock each other: Extend and a Complete within the lease change no
// indexed column of their record. (On MySQL's schema version 4, clustered
// on the expiry, an Extend or a Complete that moved the record's expiry
// moved its entry in the unique index too, and that insert's duplicate
// check locked the neighbouring entry: two such statements deadlocked.)
func testNeighboursAtOnce(t *testing.T) {
	const workers, rounds = 16, 8
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(time.Minute)), e.op()
		for r := range rounds {
			key := func(i int) string { return fmt.Sprintf("neighbour-%d-%02d", r, i) }
			claims := make([]*claim, workers)
			for i := range claims {
				claims[i] = mustClaim(t, s, e.db, charge(key(i), "100"))
			}
			for i, err := range atOnce(workers, func(i int) error { return claims[i].Extend(ctx, e.db, 2*time.Minute) }) {
				if err != nil {
					t.Errorf("Extend of %q beside %d others: %v", key(i), workers-1, err)
				}
			}
			for i, err := range atOnce(workers, func(i int) error { return e.complete(claims[i], o.biz, key(i), "done") }) {
				if err != nil {
					t.Errorf("Complete of %q beside %d others: %v", key(i), workers-1, err)
				}
			}
			for i := range workers {
				if n := e.count(o.biz, key(i)); n != 1 {
					t.Errorf("%q: %d business rows, want 1", key(i), n)
				}
				res, err := o.do(s, charge(key(i), "100"))
				if err != nil || !res.Replayed || string(res.Body) != "done" {
					t.Errorf("%q after its Complete: %+v, %v; want its replay", key(i), res, err)
				}
			}
		}
	})
}

// atOnce runs f(0) to f(n-1) in goroutines released together, and returns
// their errors, by i.
func atOnce(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// A zombie's Complete after a takeover changes nothing and returns
// ErrLeaseLost, and rolling back discards its business row.
func testStaleCompleteIsFenced(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("zombie", "100")
		zombie := mustClaim(t, s, e.db, req)
		e.expire(s, req.Key)
		owner := mustClaim(t, s, e.db, req)

		err := e.complete(zombie, o.biz, req.Key, "zombie")
		wantLeaseLost(t, err, req.Key, "taken over", fmt.Sprint(zombie.Token()), fmt.Sprint(owner.Token()), "roll back this transaction")
		if n := e.count(o.biz, req.Key); n != 0 {
			t.Fatalf("%d business rows after the zombie rolled back, want 0", n)
		}
		wantLeaseLost(t, zombie.Extend(ctx, e.db, time.Minute), "taken over")
		wantLeaseLost(t, zombie.Release(ctx, e.db), "taken over")

		must(t, e.complete(owner, o.biz, req.Key, "owner"))
		wantLeaseLost(t, e.complete(owner, o.biz, req.Key, "twice"), "already completed")
		if n := e.int64("SELECT COUNT(*) FROM "+o.biz+" WHERE k = ? AND v = 'owner'", req.Key); n != 1 || e.count(o.biz, req.Key) != 1 {
			t.Fatalf("business rows: %d, want only the owner's", e.count(o.biz, req.Key))
		}
		_, replay, err := s.Begin(ctx, e.db, req)
		must(t, err)
		if string(replay.Body) != "owner" {
			t.Fatalf("replayed %q, want the owner's result", replay.Body)
		}
	})
}

// Fencing does not rest on a counter that restarts: after the record was
// purged and the key claimed afresh, the old claim is still fenced out.
func testFencingSurvivesPurge(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(50*time.Millisecond), idem.WithRetention(300*time.Millisecond)), e.op()
		req := charge("purged", "100")
		old := mustClaim(t, s, e.db, req)
		time.Sleep(500 * time.Millisecond) // past lease and retention
		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != 1 || e.records(s, req.Key) != 0 {
			t.Fatalf("purged %d records, %d left; want the expired claim gone", n, e.records(s, req.Key))
		}
		wantLeaseLost(t, old.Extend(ctx, e.db, time.Minute), "no longer exists")

		fresh := mustClaim(t, s, e.db, req)
		if fresh.Token() <= old.Token() {
			t.Fatalf("token after purge %d, not larger than the old %d", fresh.Token(), old.Token())
		}
		wantLeaseLost(t, e.complete(old, o.biz, req.Key, "old"), "taken over")
		wantLeaseLost(t, old.Release(ctx, e.db), "taken over")
		must(t, e.complete(fresh, o.biz, req.Key, "fresh"))
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want 1", n)
		}
	})
}

// Release lets the next Begin or Do take the key over at once, with a
// larger token, and fences the released claim out.
func testRelease(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(time.Hour)), e.op()
		req := charge("release", "100")
		first := mustClaim(t, s, e.db, req)
		must(t, first.Release(ctx, e.db))
		wantLeaseLost(t, first.Release(ctx, e.db), "already released")

		second := mustClaim(t, s, e.db, req)
		if second.Token() <= first.Token() {
			t.Fatalf("token after release %d, not larger than %d", second.Token(), first.Token())
		}
		wantLeaseLost(t, e.complete(first, o.biz, req.Key, "first"), "taken over")

		must(t, second.Release(ctx, e.db))
		res, err := o.do(s, req)
		must(t, err)
		if res.Replayed || o.calls.Load() != 1 {
			t.Fatalf("Do after Release: %+v calls %d; want a fresh execution", res, o.calls.Load())
		}
		if tok := e.token(s, req.Key); tok <= second.Token() {
			t.Fatalf("token after Do's takeover %d, not larger than %d", tok, second.Token())
		}
		wantLeaseLost(t, second.Extend(ctx, e.db, time.Minute), "taken over")
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Fatalf("%d business rows, want 1", n)
		}
	})
}

// Extend works after the lease ran out as long as nobody took the key, and
// never shortens the lease; once the key is taken over it is fenced out.
func testExtend(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithLease(30*time.Second)), e.op()
		req := charge("extend", "100")
		claimed := time.Now()
		c := mustClaim(t, s, e.db, req)
		if err := c.Extend(ctx, e.db, 0); err == nil || errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Extend(0): %v, want an error about the duration", err)
		}
		must(t, c.Extend(ctx, e.db, time.Second)) // never shortens
		_, _, err := s.Begin(ctx, e.db, req)
		wantLeaseLeft(t, err, 30*time.Second, claimed)

		e.expire(s, req.Key)
		tx := e.begin(nil) // Extend through a transaction works too
		extended := time.Now()
		must(t, c.Extend(ctx, tx, 2*time.Minute))
		must(t, tx.Commit())
		_, _, err = s.Begin(ctx, e.db, req)
		wantLeaseLeft(t, err, 2*time.Minute, extended)
		must(t, e.complete(c, o.biz, req.Key, "extended"))

		other := charge("extend-2", "100")
		lost := mustClaim(t, s, e.db, other)
		e.expire(s, other.Key)
		mustClaim(t, s, e.db, other)
		wantLeaseLost(t, lost.Extend(ctx, e.db, time.Minute), "taken over", "stop the work")
	})
}

// RelayKey depends on (Scope, Key) alone: the same for every attempt and
// takeover, different across scopes and keys, at most 64 visible ASCII
// characters.
func testRelayKey(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		req := charge("relay", "100")
		first := mustClaim(t, s, e.db, req)
		must(t, first.Release(ctx, e.db))
		second := mustClaim(t, s, e.db, req)
		e.expire(s, req.Key)
		third := mustClaim(t, s, e.db, req)
		if first.RelayKey() != second.RelayKey() || second.RelayKey() != third.RelayKey() {
			t.Fatalf("relay keys differ across takeovers: %q %q %q", first.RelayKey(), second.RelayKey(), third.RelayKey())
		}
		seen := map[string]string{first.RelayKey(): "tenant-1/relay"}
		for _, sk := range [][2]string{{"tenant-2", "relay"}, {"a", "bc"}, {"ab", "c"}, {"tenant-1", "relay2"}, {"", "x"}} {
			r := idem.Request{Scope: sk[0], Key: sk[1], Operation: "op"}
			rk := mustClaim(t, s, e.db, r).RelayKey()
			if prev, dup := seen[rk]; dup {
				t.Fatalf("scope/key %q and %q share the relay key %q", prev, sk, rk)
			}
			seen[rk] = sk[0] + "/" + sk[1]
		}
		for rk := range seen {
			if len(rk) == 0 || len(rk) > 64 {
				t.Errorf("relay key %q is %d characters, want 1..64", rk, len(rk))
			}
			for _, c := range []byte(rk) {
				if c < 0x21 || c > 0x7e {
					t.Errorf("relay key %q holds %#x, not visible ASCII", rk, c)
				}
			}
		}
	})
}

// Every time comes from the database clock. An application clock cannot be
// skewed from inside a test, so this shows both halves of the argument:
// (1) the package's code never reads the application's clock (no
// time.Now, time.Since or time.Until outside tests, but for the stopwatch
// in event.go that times an Observer's events, cache.go's monotonic,
// on which the replay cache counts a duration the database gave and
// compares it with nothing but another of its readings, and the bound of
// WaitReplicatedOn, the caller's own time to wait, which it compares with
// no time of a record), so a skewed clock has
// nothing to act on; (2) a lease written with the database's own clock to
// end 7m13.2s from the database's now is reported as RetryAfter 7m14s,
// whatever the application's time is, and a lease that ended by the
// database clock is taken over, although no application time passed.
func testDatabaseClockOnly(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(rootDir(t), "*.go"))
	must(t, err)
	if len(files) == 0 {
		t.Fatal("found none of the root package's files")
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		must(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			if fn, ok := n.(*ast.FuncDecl); ok && filepath.Base(f) == "event.go" && (fn.Name.Name == "startWatch" || fn.Name.Name == "elapsed") {
				return false // durations for the Observer, never compared with a lease
			}
			if fn, ok := n.(*ast.FuncDecl); ok && filepath.Base(f) == "cache.go" && fn.Name.Name == "monotonic" {
				return false // the replay cache's deadlines: the database's durations, on the monotonic clock
			}
			if fn, ok := n.(*ast.FuncDecl); ok && filepath.Base(f) == "replication.go" && fn.Name.Name == "WaitReplicatedOn" {
				return false // the caller's bound on the wait for the standbys, never compared with a lease or an expiry
			}
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && (sel.Sel.Name == "Now" || sel.Sel.Name == "Since" || sel.Sel.Name == "Until") {
					t.Errorf("%s reads the application clock (time.%s)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("clock", "100")
		c := mustClaim(t, s, e.db, req)
		const lease = 7*time.Minute + 13200*time.Millisecond
		shifted := time.Now()
		e.setLease(s, req.Key, lease)
		_, _, err := s.Begin(ctx, e.db, req)
		wantLeaseLeft(t, err, lease, shifted) // 7m14s unless the machine stalled

		e.expire(s, req.Key)
		owner := mustClaim(t, s, e.db, req)
		wantLeaseLost(t, e.complete(c, o.biz, req.Key, "late"), "taken over")
		must(t, e.complete(owner, o.biz, req.Key, "owner"))
	})
}

// WithLockTimeout: a duplicate waiting on another open transaction's claim
// gives up after the bound with *InFlightError; its transaction stays
// usable, keeps its own rows and its session settings. Where idem cannot
// bound the wait (BoundsLockWaits: SQLite) the option is refused with an
// error that says so.
func testLockTimeout(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const bound = 300 * time.Millisecond
		if !e.BoundsLockWaits {
			_, err := idem.New(e.Dialect, idem.WithLockTimeout(bound))
			if err == nil || !strings.Contains(err.Error(), "WithLockTimeout is not supported") {
				t.Fatalf("WithLockTimeout on %s: %v, want it refused", e.Name, err)
			}
			return
		}
		s, o := e.store(idem.WithLockTimeout(bound)), e.op()
		req := charge("lock-timeout", "100")
		holder := e.begin(nil)
		_, err := s.Do(ctx, holder, req, o.fn(holder, req.Key))
		must(t, err)

		// The bound, as the dialect applies it: rounded up to its unit.
		applied, slack := (bound + e.LockWaitUnit - 1).Truncate(e.LockWaitUnit), 2*time.Second
		tx := e.begin(&sql.TxOptions{Isolation: sql.LevelReadCommitted})
		must(t, e.insertRow(tx, o.biz, "own-row", "before"))
		var before, after string
		must(t, tx.QueryRow(e.SessionProbe).Scan(&before))
		start := time.Now()
		_, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
		waited := time.Since(start)
		wantInFlight(t, err, time.Second, time.Second)
		if waited < applied || waited > applied+slack {
			t.Fatalf("gave up after %v, want about %v", waited, applied)
		}
		t.Logf("WithLockTimeout(%v): the duplicate gave up after %v", bound, waited.Round(time.Millisecond))
		must(t, tx.QueryRow(e.SessionProbe).Scan(&after))
		if before != after {
			t.Fatalf("session was %q before Do and %q after", before, after)
		}
		must(t, e.insertRow(tx, o.biz, "own-row", "after"))
		must(t, tx.Commit())
		if n := e.count(o.biz, "own-row"); n != 2 {
			t.Fatalf("%d of the caller's own rows committed, want 2", n)
		}

		// Begin is bounded the same way.
		start = time.Now()
		_, _, err = s.Begin(ctx, e.db, req)
		wantInFlight(t, err, time.Second, time.Second)
		if waited := time.Since(start); waited > applied+slack {
			t.Fatalf("Begin gave up after %v, want about %v", waited, applied)
		}

		must(t, holder.Commit())
		res, err := o.do(s, req)
		must(t, err)
		if !res.Replayed || e.count(o.biz, req.Key) != 1 || o.calls.Load() != 1 {
			t.Fatalf("after the holder committed: %+v, %d business rows, %d calls", res, e.count(o.biz, req.Key), o.calls.Load())
		}

		// Uncontended, the option costs the documented statements and
		// leaves the session as it was, on the fresh and the replay path;
		// where the read first waits for no holder (PostgreSQL: a plain
		// read) it runs before the bound, and a replay it finds costs
		// none of the bound's statements.
		extra := e.LockTimeoutStatements + e.SettingsCheck
		for _, path := range []string{"fresh", "replay"} {
			tx := e.begin(nil)
			must(t, tx.QueryRow(e.SessionProbe).Scan(&before))
			watched, n := counted(tx)
			_, err := s.Do(ctx, watched, charge("bounded", "1"), ok)
			must(t, err)
			must(t, tx.QueryRow(e.SessionProbe).Scan(&after))
			must(t, tx.Commit())
			want := freshStatements + extra
			if path == "replay" {
				want = 1 + extra // s completed the key: it reads the record, no claim statement
				if e.ReadFirstLocksNothing {
					want = 1 + e.SettingsCheck
				}
			}
			if n := n.Load(); n != want {
				t.Errorf("%s path with WithLockTimeout ran %d statements, want %d", path, n, want)
			}
			if before != after {
				t.Errorf("%s path: session was %q before Do and %q after", path, before, after)
			}
		}

		for _, d := range []time.Duration{0, -time.Second, 25 * time.Hour} {
			if _, err := idem.New(e.Dialect, idem.WithLockTimeout(d)); err == nil || !strings.Contains(err.Error(), "lock timeout") {
				t.Errorf("WithLockTimeout(%v): %v, want an error about it", d, err)
			}
		}
	})
}

// rootDir is the directory of idem's root package, as the go command
// builds the test: the repository's, or the module cache's.
func rootDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/idemkit/idem").Output()
	if err != nil {
		t.Fatalf("go list github.com/idemkit/idem: %v", err)
	}
	return strings.TrimSpace(string(out))
}
