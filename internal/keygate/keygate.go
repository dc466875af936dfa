// Package keygate is what idemhttp's middleware and idemgrpc's interceptor
// share as layers that hold keys: the bounds of their work (Bounds), and
// the in-memory wait of duplicates that arrive at one process: one
// request per (scope, key) at a time goes through to the database, and
// the others wait here, holding no pooled connection, instead of each
// waiting on the first one's row lock. They wait as long as a duplicate
// that reached another process waits on that row lock, and then get what
// it gets, so that a duplicate has the same answer whichever instance it
// reaches.
package keygate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Bounds checks and defaults the bounds a layer that holds keys gives its
// work (timeout: how long work that holds a key may take, and a
// duplicate wait without a lock timeout) and its Retry-After (retryAfter),
// as idemhttp's and idemgrpc's Config have them; pkg names the layer in
// its errors. Zero means the default: defaultTimeout, or in claim mode
// the Store's lease when that is shorter, and defaultRetryAfter. In claim
// mode the timeout must not exceed the lease, so that no retry takes over
// a claim whose work may still be running.
func Bounds(pkg string, s *idem.Store, claim bool, timeout, retryAfter, defaultTimeout, defaultRetryAfter time.Duration) (time.Duration, time.Duration, error) {
	if timeout < 0 || retryAfter < 0 {
		return 0, 0, fmt.Errorf("%s: Timeout and RetryAfter must not be negative, got %v and %v", pkg, timeout, retryAfter)
	}
	if retryAfter == 0 {
		retryAfter = defaultRetryAfter
	}
	lease := s.Lease()
	switch {
	case timeout == 0 && claim:
		timeout = min(defaultTimeout, lease)
	case timeout == 0:
		timeout = defaultTimeout
	case claim && timeout > lease:
		return 0, 0, fmt.Errorf("%s: Timeout %v exceeds the Store's lease %v: in ModeClaim a retry may take over a claim whose handler is still running; lower Timeout or raise the lease (idem.WithLease)", pkg, timeout, lease)
	}
	return timeout, retryAfter, nil
}

// Gate lets one request per (scope, key) at a time through. Its zero
// value is ready; entries exist only while a request holds or waits for
// them.
type Gate struct {
	mu      sync.Mutex
	entries map[key]*entry
}

type key struct{ scope, key string }

type entry struct {
	token chan struct{} // holds a value while a request with the key is through
	refs  int           // requests holding or waiting for the token
}

// Wait lets the request req through once no other request with its key is
// through, and returns the leave function that lets the next one in. It
// waits at most as long as a duplicate in another process waits on the
// row lock: the lock timeout of s ([idem.WithLockTimeout]) when it has
// one, else timeout. Past that it returns what that duplicate gets, an
// *idem.InFlightError whose RetryAfter is the lock timeout rounded up to
// a second (retryAfter without one); when ctx ends first, ctx's error.
// A request whose key nobody holds goes through at once, without a timer.
func (g *Gate) Wait(ctx context.Context, s *idem.Store, req idem.Request, timeout, retryAfter time.Duration) (leave func(), err error) {
	k := key{scope: req.Scope, key: req.Key}
	e := g.join(k)
	leave = func() {
		<-e.token
		g.unref(k, e)
	}
	select {
	case e.token <- struct{}{}:
		return leave, nil
	default:
	}
	bound := timeout
	if d, ok := s.LockTimeout(); ok {
		bound, retryAfter = d, max((d+time.Second-1)/time.Second, 1)*time.Second
	}
	wait := time.NewTimer(bound)
	defer wait.Stop()
	select {
	case e.token <- struct{}{}:
		return leave, nil
	case <-ctx.Done():
		g.unref(k, e)
		return nil, ctx.Err()
	case <-wait.C:
		g.unref(k, e)
		return nil, &idem.InFlightError{RetryAfter: retryAfter}
	}
}

// join counts a request with k as holding or waiting for k's entry, and
// returns the entry.
func (g *Gate) join(k key) *entry {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.entries == nil {
		g.entries = map[key]*entry{}
	}
	e := g.entries[k]
	if e == nil {
		e = &entry{token: make(chan struct{}, 1)}
		g.entries[k] = e
	}
	e.refs++
	return e
}

func (g *Gate) unref(k key, e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(g.entries, k)
	}
}
