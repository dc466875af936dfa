package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// EventKind is the outcome an Event reports.
type EventKind int

// The outcomes idem reports to an Observer.
const (
	// EventExecuted: fn ran and its response was stored in the caller's
	// transaction (which may still roll back).
	EventExecuted EventKind = iota + 1
	// EventReplayed: a stored response was returned; fn did not run.
	EventReplayed
	// EventInFlight: another live claim holds the key (ErrInFlight).
	EventInFlight
	// EventMismatch: the key was used with another request (ErrMismatch).
	EventMismatch
	// EventTakeover: a claim whose lease had ended, a released claim or a
	// record past retention was taken over; fn runs next. Token is the
	// token of the claim taken over. Many takeovers mean processes die or
	// stall after Begin, or leases are too short.
	EventTakeover
	// EventLeaseLost: a claim's completion, heartbeat or release found it
	// taken over (ErrLeaseLost). Token is the token of the claim that lost.
	EventLeaseLost
	// EventFailed: fn or one of idem's statements returned an error, which
	// is in Err; nothing was stored.
	EventFailed
	// EventPurgeBatch: Purge ran one batch and deleted Rows records.
	EventPurgeBatch
)

var eventNames = [...]string{
	EventExecuted:   "executed",
	EventReplayed:   "replayed",
	EventInFlight:   "in_flight",
	EventMismatch:   "mismatch",
	EventTakeover:   "takeover",
	EventLeaseLost:  "lease_lost",
	EventFailed:     "failed",
	EventPurgeBatch: "purge_batch",
}

// String is the kind's name in snake case, e.g. "in_flight".
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event describes one outcome. It never holds the request's payload or the
// stored response: only the fields below.
type Event struct {
	Kind      EventKind
	Table     string        // the Store's table
	Scope     string        // the request's Scope; empty for a purge batch
	Key       string        // the request's Key; empty for a purge batch
	Operation string        // the request's Operation; empty for a purge batch
	Duration  time.Duration // of the call (Do, Begin, Complete, ...) or of the purge batch
	Token     int64         // EventTakeover, EventLeaseLost: the claim's fencing token
	Rows      int64         // EventPurgeBatch: records deleted by the batch
	Err       error         // EventFailed, or a purge batch that failed
}

// Observer receives one Event per outcome. idem calls it synchronously on
// the goroutine of the call it reports, after the outcome is known and
// before the call returns, so it must be quick and must not block; it may
// be called from many goroutines at once.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f(ctx, ev).
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

// WithObserver sets the Observer that receives an Event for every outcome
// of Do and Purge (and of the two-phase calls). By default there is none.
// Use SlogObserver to log the events, or count them into your own metrics.
func WithObserver(o Observer) Option { return func(s *Store) { s.observer = o } }

// observe reports ev to the Store's Observer, if any.
func (s *Store) observe(ctx context.Context, ev Event) {
	if s.observer == nil {
		return
	}
	ev.Table = s.table
	s.observer.Observe(ctx, ev)
}

// observeDo reports the outcome of a Do that began at start and returns
// res, err. It is deferred by Do, so that every return reports once.
func (s *Store) observeDo(ctx context.Context, req Request, start time.Time, res *Result, err *error) {
	if s.observer == nil {
		return
	}
	ev := Event{Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: time.Since(start)}
	switch e := *err; {
	case e == nil && res.Replayed:
		ev.Kind = EventReplayed
	case e == nil:
		ev.Kind = EventExecuted
	case errors.Is(e, ErrInFlight):
		ev.Kind = EventInFlight
	case errors.Is(e, ErrMismatch):
		ev.Kind = EventMismatch
	case errors.Is(e, ErrLeaseLost):
		ev.Kind = EventLeaseLost
	default:
		ev.Kind, ev.Err = EventFailed, e
	}
	s.observe(ctx, ev)
}

// SlogObserver returns an Observer that logs every Event on l, message
// "idem " plus the kind, with the attributes table, scope, key, operation,
// duration, and token, rows or err where they apply. The levels: executed,
// replayed and purge_batch at Debug; in_flight and mismatch (a client's
// doing) at Info; takeover, lease_lost and failed (a process died or
// stalled, or a statement failed) and a failed purge batch at Warn.
func SlogObserver(l *slog.Logger) Observer {
	return ObserverFunc(func(ctx context.Context, ev Event) {
		level := slog.LevelDebug
		switch {
		case ev.Kind == EventInFlight || ev.Kind == EventMismatch:
			level = slog.LevelInfo
		case ev.Kind == EventTakeover || ev.Kind == EventLeaseLost || ev.Kind == EventFailed || ev.Err != nil:
			level = slog.LevelWarn
		}
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := make([]slog.Attr, 0, 7)
		attrs = append(attrs, slog.String("table", ev.Table))
		if ev.Kind != EventPurgeBatch {
			attrs = append(attrs, slog.String("scope", ev.Scope), slog.String("key", ev.Key), slog.String("operation", ev.Operation))
		}
		attrs = append(attrs, slog.Duration("duration", ev.Duration))
		switch ev.Kind {
		case EventTakeover, EventLeaseLost:
			attrs = append(attrs, slog.Int64("token", ev.Token))
		case EventPurgeBatch:
			attrs = append(attrs, slog.Int64("rows", ev.Rows))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.Any("err", ev.Err))
		}
		l.LogAttrs(ctx, level, "idem "+ev.Kind.String(), attrs...)
	})
}
