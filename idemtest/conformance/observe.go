package conformance

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// recorder is an Observer that keeps every Event.
type recorder struct {
	mu     sync.Mutex
	events []idem.Event
}

func (r *recorder) Observe(_ context.Context, ev idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

// take returns the events recorded so far and forgets them.
func (r *recorder) take() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.events
	r.events = nil
	return evs
}

// expect returns a check for one step: the events recorded since the last
// check are of the kinds want, in order, each on table with a duration and,
// unless scope is empty, on scope. The check returns them.
func (r *recorder) expect(t *testing.T, table, scope string) func(step string, want ...idem.EventKind) []idem.Event {
	return func(step string, want ...idem.EventKind) []idem.Event {
		t.Helper()
		evs := r.take()
		if got := kinds(evs); !slices.Equal(got, want) {
			t.Fatalf("%s: events %v, want %v", step, got, want)
		}
		for _, ev := range evs {
			if ev.Table != table || (scope != "" && ev.Scope != scope) || ev.Duration <= 0 {
				t.Errorf("%s: %v event with table %q, scope %q, duration %v", step, ev.Kind, ev.Table, ev.Scope, ev.Duration)
			}
		}
		return evs
	}
}

// kinds lists the kinds of events in order.
func kinds(evs []idem.Event) []idem.EventKind {
	ks := make([]idem.EventKind, len(evs))
	for i, ev := range evs {
		ks[i] = ev.Kind
	}
	return ks
}

// Every outcome of Do and every purge batch reaches the Observer once, with
// the table, scope, key, operation and a duration.
func testObserver(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		rec := &recorder{}
		s, o := e.store(idem.WithObserver(rec)), e.op()
		run := func(req idem.Request) error {
			_, err := o.do(s, req)
			return err
		}
		expect := rec.expect(t, s.Table(), "")

		req := charge("observed", "100")
		must(t, run(req))
		ev := expect("fresh key", idem.EventExecuted)[0]
		if ev.Scope != req.Scope || ev.Key != req.Key || ev.Operation != req.Operation || ev.Err != nil {
			t.Errorf("executed event %+v does not describe %+v", ev, req)
		}
		must(t, run(req))
		expect("retry", idem.EventReplayed)
		if err := run(charge(req.Key, "999")); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("other payload: %v, want ErrMismatch", err)
		}
		expect("other payload", idem.EventMismatch)

		// A request refused before any statement is a client's doing,
		// reported as invalid with the reason; no statement ran.
		bad := charge("bad key", "1")
		if err := run(bad); !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("invalid key: %v, want ErrInvalidKey", err)
		}
		if ev := expect("invalid key", idem.EventInvalid)[0]; !errors.Is(ev.Err, idem.ErrInvalidKey) || ev.Key != bad.Key {
			t.Errorf("invalid event %+v, want the key and ErrInvalidKey", ev)
		}
		if _, _, err := s.Begin(ctx, e.db, idem.Request{Scope: "a\x00b", Key: "k"}); !errors.Is(err, idem.ErrInvalidRequest) {
			t.Fatalf("invalid scope: %v, want ErrInvalidRequest", err)
		}
		expect("invalid scope", idem.EventInvalid)

		e.leaveClaim(s, charge("claimed", "1"), time.Hour)
		expect("leaving a live claim", idem.EventExecuted)
		if err := run(charge("claimed", "1")); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("live claim: %v, want ErrInFlight", err)
		}
		expect("live claim", idem.EventInFlight)

		e.leaveClaim(s, charge("crashed", "1"), 0)
		expect("leaving an expired claim", idem.EventExecuted)
		token := e.token(s, "crashed")
		must(t, run(charge("crashed", "1")))
		if ev := expect("expired claim", idem.EventTakeover, idem.EventExecuted)[0]; ev.Token != token || ev.Key != "crashed" {
			t.Errorf("takeover event: token %d key %q, want token %d of the claim taken over, key crashed", ev.Token, ev.Key, token)
		}

		boom := errors.New("boom")
		_, err := e.do(s, charge("failing", "1"), func(handle) func(context.Context) (idem.Response, error) {
			return func(context.Context) (idem.Response, error) { return idem.Response{}, boom }
		})
		if !errors.Is(err, boom) {
			t.Fatalf("failing fn: %v", err)
		}
		if ev := expect("failing fn", idem.EventFailed)[0]; !errors.Is(ev.Err, boom) {
			t.Errorf("failed event carries %v, want the fn's error", ev.Err)
		}

		func() {
			defer func() {
				if p := recover(); p != "fn panics" {
					t.Fatalf("recovered %v, want fn's panic", p)
				}
			}()
			_, _ = e.do(s, charge("panicking", "1"), func(handle) func(context.Context) (idem.Response, error) {
				return func(context.Context) (idem.Response, error) { panic("fn panics") }
			})
		}()
		if ev := expect("panicking fn", idem.EventFailed)[0]; ev.Err == nil || ev.Key != "panicking" {
			t.Errorf("failed event for a panic: %+v, want an Err naming the panic", ev)
		}

		e.seed(s, scopeExpired, 25, 48*time.Hour, -48*time.Hour, "completed")
		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		var rows []int64
		for _, ev := range expect("purge", idem.EventPurgeBatch, idem.EventPurgeBatch, idem.EventPurgeBatch) {
			rows = append(rows, ev.Rows)
			if ev.Scope != "" || ev.Key != "" || ev.Err != nil {
				t.Errorf("purge batch event %+v names a request or an error", ev)
			}
		}
		if n != 25 || rows[0] != 10 || rows[1] != 10 || rows[2] != 5 {
			t.Errorf("purged %d in batches %v, want 25 in 10, 10, 5", n, rows)
		}
		if o.calls.Load() != 2 || e.int64("SELECT COUNT(*) FROM "+o.biz) != 2 {
			t.Errorf("%d executions, want 2 (the fresh key and the takeover)", o.calls.Load())
		}
	})
}

// The two-phase calls report their outcomes too: a claim, a replay, a
// takeover, a completion, a release and a fenced-out claim's lease lost;
// a heartbeat that succeeds reports nothing.
func testObserverClaims(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		rec := &recorder{}
		s, o := e.store(idem.WithObserver(rec)), e.op()
		expect := rec.expect(t, s.Table(), "tenant-1")

		req := charge("two-phase", "100")
		zombie := mustClaim(t, s, e.db, req)
		if ev := expect("Begin", idem.EventClaimed)[0]; ev.Token != zombie.Token() {
			t.Errorf("claimed event token %d, want %d", ev.Token, zombie.Token())
		}
		_, _, err := s.Begin(ctx, e.db, req)
		wantInFlight(t, err, time.Second, idem.DefaultLease)
		expect("Begin on a live claim", idem.EventInFlight)
		must(t, zombie.Extend(ctx, e.db, time.Minute))
		expect("Extend")

		e.expire(s, req.Key)
		owner := mustClaim(t, s, e.db, req)
		if evs := expect("Begin on an expired claim", idem.EventTakeover, idem.EventClaimed); evs[0].Token != zombie.Token() || evs[1].Token != owner.Token() {
			t.Errorf("takeover token %d, claimed token %d; want %d and %d", evs[0].Token, evs[1].Token, zombie.Token(), owner.Token())
		}
		wantLeaseLost(t, e.complete(zombie, o.biz, req.Key, "zombie"))
		if ev := expect("the zombie's Complete", idem.EventLeaseLost)[0]; ev.Token != zombie.Token() {
			t.Errorf("lease lost event token %d, want the zombie's %d", ev.Token, zombie.Token())
		}
		wantLeaseLost(t, zombie.Extend(ctx, e.db, time.Minute))
		expect("the zombie's Extend", idem.EventLeaseLost)
		must(t, e.complete(owner, o.biz, req.Key, "owner"))
		expect("the owner's Complete", idem.EventExecuted)
		_, replay, err := s.Begin(ctx, e.db, req)
		must(t, err)
		if replay == nil {
			t.Fatalf("Begin after Complete: no replay")
		}
		expect("Begin after Complete", idem.EventReplayed)

		released := mustClaim(t, s, e.db, charge("released", "1"))
		expect("Begin", idem.EventClaimed)
		must(t, released.Release(ctx, e.db))
		expect("Release", idem.EventReleased)
		if n := e.count(o.biz, req.Key); n != 1 {
			t.Errorf("%d business rows, want the owner's only", n)
		}
	})
}
