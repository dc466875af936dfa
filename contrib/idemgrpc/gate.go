package idemgrpc

import (
	"context"
	"sync"
)

// gate lets one call per (scope, key) at a time through to the
// database, so that duplicates arriving at this process wait in memory
// instead of each holding a pooled connection while it waits on the first
// one's row lock. Entries exist only while a call holds or waits for
// them. (A copy of idemhttp's gate.)
type gate struct {
	mu      sync.Mutex
	entries map[gateKey]*gateEntry
}

type gateKey struct{ scope, key string }

type gateEntry struct {
	token chan struct{} // holds a value while a call with the key is through
	refs  int           // calls holding or waiting for the token
}

// enter waits until no other call with k is through, then lets this
// one through and returns the leave function that lets the next one in.
// It returns ctx's error if ctx ends first.
func (g *gate) enter(ctx context.Context, k gateKey) (leave func(), err error) {
	g.mu.Lock()
	if g.entries == nil {
		g.entries = map[gateKey]*gateEntry{}
	}
	e := g.entries[k]
	if e == nil {
		e = &gateEntry{token: make(chan struct{}, 1)}
		g.entries[k] = e
	}
	e.refs++
	g.mu.Unlock()
	select {
	case e.token <- struct{}{}:
		return func() {
			<-e.token
			g.unref(k, e)
		}, nil
	case <-ctx.Done():
		g.unref(k, e)
		return nil, ctx.Err()
	}
}

func (g *gate) unref(k gateKey, e *gateEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(g.entries, k)
	}
}
