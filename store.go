package idem

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Store records idempotency keys in one table through one [Dialect].
// It holds no connections and is safe for concurrent use.
type Store struct {
	dialect   Dialect
	table     string
	lease     time.Duration
	retention time.Duration
	lockWait  time.Duration // with hasLockWait: the bound of WithLockTimeout
	st        statements    // the dialect's statements for the table
	observer  Observer
	// completed holds the keys this Store has served (completed.go).
	completed *completed
	// purgeFrom is where the next purge batch starts: a created_at in µs
	// since the Unix epoch, 0 for the beginning (purge.go).
	purgeFrom atomic.Int64
	// hasLockWait reports that WithLockTimeout was given.
	hasLockWait bool
}

// Report passes ev to the Store's [Observer], if any, with the Store's
// table and dialect filled in. It is for a layer above the Store to report
// an outcome that never reached Do or Begin, so that it counts beside
// theirs: idemhttp reports a request it refused for a missing key or a
// body it cannot take as [EventInvalid], and a duplicate that gave up
// waiting for its key in memory as [EventInFlight].
func (s *Store) Report(ctx context.Context, ev Event) { s.observe(ctx, ev) }

// observe reports ev to the Store's Observer, if any.
func (s *Store) observe(ctx context.Context, ev Event) {
	if s.observer == nil {
		return
	}
	ev.Table, ev.Dialect = s.table, s.dialect.Name()
	s.observer.Observe(ctx, ev)
}

// observeErr reports ev when err is nil, and otherwise the kind of
// failure err is.
func (s *Store) observeErr(ctx context.Context, ev Event, err error) {
	switch {
	case err == nil:
	case errors.Is(err, ErrInFlight):
		ev.Kind = EventInFlight
	case errors.Is(err, ErrMismatch):
		ev.Kind = EventMismatch
	case errors.Is(err, ErrLeaseLost):
		ev.Kind = EventLeaseLost
	case errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidRequest):
		ev.Kind, ev.Err = EventInvalid, err
	default:
		ev.Kind, ev.Err = EventFailed, err
	}
	s.observe(ctx, ev)
}
