package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Purge deletes what is past retention, in batches, and nothing else: not
// a record within retention, not a live claim.
func TestPurge(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store(idem.WithRetention(time.Second)) // "new" must outlive a stall of the loaded suite
		ok := func(idem.DBTX) func(context.Context) (idem.Response, error) {
			return func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 200}, nil }
		}
		for _, k := range []string{"old-1", "old-2", "old-3", "old-4", "old-5"} {
			_, err := e.do(s, charge(k, "1"), ok)
			must(t, err)
		}
		e.leaveClaim(s, charge("old-dead-claim", "1"), 0)
		e.leaveClaim(s, charge("live-claim", "1"), time.Hour)
		time.Sleep(1100 * time.Millisecond)
		_, err := e.do(s, charge("new", "1"), ok)
		must(t, err)

		if _, err := s.Purge(ctx, e.db, 0); err == nil {
			t.Fatalf("Purge with batch 0: no error")
		}
		n, err := s.Purge(ctx, e.db, 2)
		must(t, err)
		if n != 6 {
			t.Fatalf("purged %d records, want 6", n)
		}
		for key, want := range map[string]int{"old-1": 0, "old-dead-claim": 0, "live-claim": 1, "new": 1} {
			if got := e.records(s, key); got != want {
				t.Errorf("%s: %d records after purge, want %d", key, got, want)
			}
		}
		if _, err := e.do(s, charge("live-claim", "1"), ok); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("live claim after purge: %v, want ErrInFlight", err)
		}
	})
}
