package idemserve

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// gate lets one call per (scope, key) at a time through to the
// database; the others wait here, holding no pooled connection, instead
// of each waiting on the first one's row lock. They wait as long as a
// duplicate that reached another process waits on that row lock, and
// then get what it gets, so that a duplicate has the same answer whichever
// instance it reaches. Its zero value is ready; entries exist only while
// a call holds or waits for them.
type gate struct {
	mu      sync.Mutex
	entries map[key]*entry
}

type key struct{ scope, key string }

type entry struct {
	token chan struct{} // holds a value while a request with the key is through
	refs  int           // requests holding or waiting for the token
}

// wait lets the call req through once no other request with its key is
// through, and returns the leave function that lets the next one in. It
// waits at most as long as a duplicate in another process waits on the
// row lock: the lock timeout of s ([idem.WithLockTimeout]) when it has
// one, else timeout. Past that it returns what that duplicate gets, an
// *idem.InFlightError whose RetryAfter is the lock timeout rounded up to
// a second (retryAfter without one); when ctx ends first, ctx's error.
// A request whose key nobody holds goes through at once, without a timer.
func (g *gate) wait(ctx context.Context, s *idem.Store, req idem.Request, timeout, retryAfter time.Duration) (leave func(), err error) {
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
func (g *gate) join(k key) *entry {
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

func (g *gate) unref(k key, e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(g.entries, k)
	}
}
