package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The gate lets one request per key through at a time and the others
// wait; a waiter whose context ends leaves; keys do not wait for each
// other; and the map is empty once nobody holds or waits.
func TestGate(t *testing.T) {
	var (
		g       gate
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
			leave, err := g.enter(ctx, gateKey{scope: "s", key: fmt.Sprint(k)})
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

	leave, err := g.enter(context.Background(), gateKey{key: "held"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := g.enter(context.Background(), gateKey{scope: "other", key: "held"})
	if err != nil {
		t.Fatal(err)
	}
	other()
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := g.enter(ctx, gateKey{key: "held"})
		waited <- err
	}()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled waiter got %v, want context.Canceled", err)
	}
	expired, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := g.enter(expired, gateKey{key: "held"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiter past its deadline got %v, want context.DeadlineExceeded", err)
	}
	leave()
	if n := len(g.entries); n != 0 {
		t.Fatalf("%d entries left after the holder and the cancelled waiters left", n)
	}
}
