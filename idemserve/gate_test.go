package idemserve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The gate lets one request per key through at a time and the others
// wait; a waiter whose context ends leaves; keys do not wait for each
// other; and the map is empty once nobody holds or waits.
func TestGate(t *testing.T) {
	s, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	var g gate
	enter := func(ctx context.Context, scope, key string) (func(), error) {
		return g.wait(ctx, s, idem.Request{Scope: scope, Key: key}, time.Hour, time.Second)
	}
	var (
		wg      sync.WaitGroup
		through [3]atomic.Int64
		most    [3]atomic.Int64
		mu      sync.Mutex
		errs    []error
	)
	for i := range 60 {
		wg.Go(func() {
			k := i % 3
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			leave, err := enter(ctx, "s", fmt.Sprint(k))
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			n := through[k].Add(1)
			for m := most[k].Load(); n > m && !most[k].CompareAndSwap(m, n); m = most[k].Load() {
			}
			time.Sleep(time.Millisecond)
			through[k].Add(-1)
			leave()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for k := range most {
		if m := most[k].Load(); m != 1 {
			t.Errorf("key %d: %d requests through at once, want 1", k, m)
		}
	}
	if n := len(g.entries); n != 0 {
		t.Fatalf("%d entries left after every request left", n)
	}

	leave, err := enter(context.Background(), "", "held")
	if err != nil {
		t.Fatal(err)
	}
	other, err := enter(context.Background(), "other", "held")
	if err != nil {
		t.Fatal(err)
	}
	other()
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := enter(ctx, "", "held")
		waited <- err
	}()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled waiter got %v, want context.Canceled", err)
	}
	expired, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := enter(expired, "", "held"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiter past its deadline got %v, want context.DeadlineExceeded", err)
	}
	leave()
	if n := len(g.entries); n != 0 {
		t.Fatalf("%d entries left after the holder and the cancelled waiters left", n)
	}
}

// A duplicate waits as long as one in another process waits on the row
// lock, and then gets what that one gets: past the Store's lock timeout,
// an InFlightError whose RetryAfter is that timeout rounded up to a
// second; without one, past the caller's timeout, its retryAfter. A
// caller that goes first gets its context's error.
func TestWaitIsBoundedAsTheRowLock(t *testing.T) {
	bounded, err := idem.New(idem.Postgres, idem.WithLockTimeout(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	unbounded, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	var g gate
	req := idem.Request{Scope: "s", Key: "k"}
	leave, err := g.wait(context.Background(), unbounded, req, time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	for name, c := range map[string]struct {
		s          *idem.Store
		timeout    time.Duration
		retryAfter time.Duration
	}{
		"lock timeout": {bounded, time.Hour, time.Second},
		"timeout":      {unbounded, 30 * time.Millisecond, 7 * time.Second},
	} {
		start := time.Now()
		_, err := g.wait(context.Background(), c.s, req, c.timeout, 7*time.Second)
		var inFlight *idem.InFlightError
		if !errors.As(err, &inFlight) || inFlight.RetryAfter != c.retryAfter {
			t.Errorf("%s: %v, want an InFlightError with RetryAfter %v", name, err, c.retryAfter)
		}
		if waited := time.Since(start); waited < 30*time.Millisecond || waited > 10*time.Second {
			t.Errorf("%s: gave up after %v, want about 30ms", name, waited)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.wait(ctx, bounded, req, time.Hour, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller that went: %v, want context.Canceled", err)
	}
}
