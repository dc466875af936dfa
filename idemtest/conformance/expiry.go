package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// A request's own Retention is its record's: a record of an hour and one
// of a day on one Store, both 90 minutes old, are forgotten and replayed
// respectively, and the purge deletes the first and keeps the second. A
// Retention out of bounds is refused before any statement.
func testRetentionPerRequest(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithRetention(time.Hour)), e.op()
		short, long := charge("short", "1"), charge("long", "1")
		long.Retention = 24 * time.Hour
		for _, req := range []idem.Request{short, long} {
			_, err := o.do(s, req)
			must(t, err)
			e.age(s, req.Key, 90*time.Minute)
		}
		if res, err := o.do(s, long); err != nil || !res.Replayed {
			t.Fatalf("a record of a day, 90 minutes old: %+v, %v; want a replay", res, err)
		}
		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != 1 || e.records(s, "short") != 0 || e.records(s, "long") != 1 {
			t.Fatalf("purged %d; short has %d records, long %d; want 1, 0 and 1", n, e.records(s, "short"), e.records(s, "long"))
		}
		if res, err := o.do(s, charge("short", "2")); err != nil || res.Replayed {
			t.Fatalf("a record of an hour, 90 minutes old, with another payload: %+v, %v; want a fresh run", res, err)
		}
		for _, bad := range []time.Duration{-time.Second, idem.MaxDuration + time.Hour} {
			req := charge("bad-retention", "1")
			req.Retention = bad
			if err := e.doOK(s, req); !errors.Is(err, idem.ErrInvalidRequest) {
				t.Errorf("Retention %v: %v, want ErrInvalidRequest", bad, err)
			}
		}
		if got := o.calls.Load(); got != 3 {
			t.Fatalf("fn ran %d times, want 3", got)
		}
	})
}

// Under a key memory a key outlives its response: past its retention a
// request that matches is ErrExpired and one that does not is
// ErrMismatch, and neither runs, before the purge and after it (which
// drops the response and keeps the key, status expired); once the key
// memory has passed too, the purge deletes the record and the key runs
// afresh. A Claim completed late counts its retention from then.
func testKeyMemory(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithRetention(time.Hour), idem.WithKeyMemory(24*time.Hour)), e.op()
		req := charge("remembered", "1")
		_, err := o.do(s, req)
		must(t, err)
		e.age(s, req.Key, 2*time.Hour)
		refused := func(when string) {
			t.Helper()
			if _, err := o.do(s, req); !errors.Is(err, idem.ErrExpired) {
				t.Fatalf("%s: the same request: %v, want ErrExpired", when, err)
			}
			if _, err := o.do(s, charge(req.Key, "2")); !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("%s: another payload: %v, want ErrMismatch", when, err)
			}
		}
		refused("past retention")
		r, err := s.Inspect(ctx, e.db, req.Scope, req.Key)
		must(t, err)
		if r == nil || !r.Expired || r.Forgotten {
			t.Fatalf("Inspect past retention: %+v; want expired, not forgotten", r)
		}
		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != 1 || e.records(s, req.Key) != 1 {
			t.Fatalf("the purge past retention: %d purged, %d records; want 1 and the key kept", n, e.records(s, req.Key))
		}
		r, err = s.Inspect(ctx, e.db, req.Scope, req.Key)
		must(t, err)
		if r == nil || r.Status != idem.StatusExpired || r.Response != nil || !r.Expired {
			t.Fatalf("Inspect after the purge: %+v; want status expired, no response", r)
		}
		refused("after the purge")
		e.age(s, req.Key, 25*time.Hour)
		n, err = s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != 1 || e.records(s, req.Key) != 0 {
			t.Fatalf("the purge past the key memory: %d purged, %d records; want 1 and 0", n, e.records(s, req.Key))
		}
		if res, err := o.do(s, charge(req.Key, "3")); err != nil || res.Replayed {
			t.Fatalf("past the key memory: %+v, %v; want a fresh run", res, err)
		}
		if got := o.calls.Load(); got != 2 {
			t.Fatalf("fn ran %d times, want 2", got)
		}

		late := charge("late-claim", "1")
		c, _, err := s.Begin(ctx, e.db, late)
		must(t, err)
		e.age(s, late.Key, 2*time.Hour)
		tx := e.begin(nil)
		must(t, c.Complete(ctx, tx, idem.Response{StatusCode: 201}))
		must(t, tx.Commit())
		if res, err := e.do(s, late, func(handle) func(context.Context) (idem.Response, error) { return ok }); err != nil || !res.Replayed {
			t.Fatalf("a claim completed two hours after its Begin: %+v, %v; want a replay, its retention counted from the completion", res, err)
		}
	})
}
