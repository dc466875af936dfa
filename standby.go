package idem

import "sync"

// standbyWaiter is one WaitReplicatedOn waiting: for want standbys to
// have flushed WAL up to at (bytes). done receives nil when they have,
// or the error of a read of their positions.
type standbyWaiter struct {
	at      uint64
	want    int
	reached int // how many had, at the last read (under standbyWatches.mu)
	done    chan error
}

// standbyWatches are a Store's reads of the standbys' positions, one
// loop per handle that answers are waiting on: each read serves every
// wait on the handle at once, so that a primary is read once a pause
// however many answers wait on it.
type standbyWatches struct {
	mu sync.Mutex
	// on holds each handle's waits, while it has any: by the handle,
	// where it is comparable, else by the wait's own key.
	on map[any]*standbyWatch
}

// standbyWatch is the waits on one handle, and the wake of its loop.
type standbyWatch struct {
	waiters map[*standbyWaiter]struct{}
	wake    chan struct{} // buffered 1: a wait was added
}

// remove gives up w, and returns how many standbys had reached its
// position at the last read.
func (ws *standbyWatches) remove(w *standbyWaiter) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, watch := range ws.on {
		delete(watch.waiters, w)
	}
	return w.reached
}
