package idem

import (
	"context"
	"errors"
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
	// hasLockWait reports that WithLockTimeout was given.
	hasLockWait bool
}

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
	default:
		ev.Kind, ev.Err = EventFailed, err
	}
	s.observe(ctx, ev)
}
