package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// EventKind is the outcome an [Event] reports.
type EventKind int

// The outcomes idem reports to an [Observer].
const (
	// EventExecuted: the operation's response was stored, by Do after fn
	// ran or by [Claim.Complete], in the caller's transaction (which may
	// still roll back).
	EventExecuted EventKind = iota + 1
	// EventReplayed: a stored response was returned (by Do or Begin); fn
	// did not run.
	EventReplayed
	// EventInFlight: another live claim holds the key ([ErrInFlight]).
	EventInFlight
	// EventMismatch: the key was used with another request ([ErrMismatch]).
	EventMismatch
	// EventTakeover: a claim whose lease had ended, a released claim or a
	// record past retention was taken over by Do or Begin; the operation
	// runs again. Token is the token of the claim taken over. Many
	// takeovers mean processes die or stall after Begin, or leases are too
	// short. It is followed by the outcome of the Do or Begin. Like
	// [EventExecuted] it is reported inside the transaction, which may still
	// roll back (and be retried).
	EventTakeover
	// EventLeaseLost: a [Claim]'s Complete, Extend or Release found it no
	// longer current ([ErrLeaseLost]). Token is the token of the claim that
	// lost.
	EventLeaseLost
	// EventFailed: fn, a [Claim] method's input or one of idem's statements
	// returned an error, which is in Err, or fn panicked; nothing was
	// stored.
	EventFailed
	// EventPurgeBatch: Purge ran one batch and deleted Rows records.
	EventPurgeBatch
	// EventClaimed: Begin committed a claim for a key; Token is its token.
	// The caller runs the operation, then completes or releases the claim.
	EventClaimed
	// EventReleased: [Claim.Release] ended a claim without a result.
	EventReleased
	// EventInvalid: a request was refused before any statement ran, a
	// client's doing: Do or Begin found its key or a field invalid
	// ([ErrInvalidKey], [ErrInvalidRequest]), or a layer above the Store
	// refused it ([Store.Report]; idemhttp does for a missing key or a
	// body it cannot take). Err says why.
	EventInvalid
	// EventCacheHit: the replay cache ([WithReplayCache]) answered a
	// request without the database; the outcome (EventReplayed, or
	// EventMismatch) follows.
	EventCacheHit
	// EventCacheMiss: the replay cache held no record of a request's key,
	// which went on to the database.
	EventCacheMiss
	// EventCacheEvicted: the replay cache evicted Rows entries, the least
	// recently used, to keep its bound. Scope, Key and Operation are
	// empty.
	EventCacheEvicted
)

var eventNames = [...]string{
	EventExecuted:     "executed",
	EventReplayed:     "replayed",
	EventInFlight:     "in_flight",
	EventMismatch:     "mismatch",
	EventTakeover:     "takeover",
	EventLeaseLost:    "lease_lost",
	EventFailed:       "failed",
	EventPurgeBatch:   "purge_batch",
	EventClaimed:      "claimed",
	EventReleased:     "released",
	EventInvalid:      "invalid",
	EventCacheHit:     "cache_hit",
	EventCacheMiss:    "cache_miss",
	EventCacheEvicted: "cache_evicted",
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
	Kind      EventKind     // what happened
	Table     string        // the Store's table
	Dialect   string        // the Store's dialect's Name: "postgres", "mysql", "mariadb", "tidb", "sqlite"
	Scope     string        // the request's Scope; empty for a purge batch
	Key       string        // the request's Key; empty for a purge batch
	Operation string        // the request's Operation; empty for a purge batch
	Duration  time.Duration // of the call (Do, Begin, Complete, ...) or of the purge batch
	Token     int64         // of the claim, for the events of Begin and of a Claim's methods, and for EventTakeover
	Rows      int64         // EventPurgeBatch: records deleted by the batch
	Err       error         // EventFailed, or a purge batch that failed
}

// Observer receives one [Event] per outcome. idem calls it synchronously on
// the goroutine of the call it reports, after the outcome is known and
// before the call returns, so it must be quick and must not block; it may
// be called from many goroutines at once.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// ObserverFunc adapts a function to the [Observer] interface.
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f(ctx, ev).
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

// stopwatch measures how long a call took, for its Event. It is the only
// reader of the application's clock in the package: durations are
// reported, never compared with leases or retention, which use the
// database clock alone.
type stopwatch struct{ start time.Time }

func startWatch() stopwatch { return stopwatch{time.Now()} }

func (w stopwatch) elapsed() time.Duration { return time.Since(w.start) }

// ErrPanicked is the Err of the [EventFailed] an [Observer] receives for a Do
// or Begin that is unwinding from a panic (in fn, most likely). No call
// returns it: the panic goes on to the caller.
var ErrPanicked = errors.New("idem: the call panicked")

// SlogObserver returns an [Observer] that logs every [Event] on l, message
// "idem " plus the kind, with the attributes table, dialect, scope, key,
// operation, duration, and token, rows or err where they apply (dialect
// when set, as it is in every [Event] a [Store] reports). The levels:
// executed, replayed, claimed, released and purge_batch at Debug;
// in_flight, mismatch and invalid (a client's doing) at Info; takeover, lease_lost
// and failed (a process died or stalled, or a statement failed) and a
// failed purge batch at Warn.
func SlogObserver(l *slog.Logger) Observer {
	return ObserverFunc(func(ctx context.Context, ev Event) {
		level := slog.LevelDebug
		switch {
		case ev.Kind == EventInFlight || ev.Kind == EventMismatch || ev.Kind == EventInvalid:
			level = slog.LevelInfo
		case ev.Kind == EventTakeover || ev.Kind == EventLeaseLost || ev.Kind == EventFailed || ev.Err != nil:
			level = slog.LevelWarn
		}
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := make([]slog.Attr, 0, 8)
		attrs = append(attrs, slog.String("table", ev.Table))
		if ev.Dialect != "" {
			attrs = append(attrs, slog.String("dialect", ev.Dialect))
		}
		if ev.Kind != EventPurgeBatch {
			attrs = append(attrs, slog.String("scope", ev.Scope), slog.String("key", ev.Key), slog.String("operation", ev.Operation))
		}
		attrs = append(attrs, slog.Duration("duration", ev.Duration))
		if ev.Token != 0 {
			attrs = append(attrs, slog.Int64("token", ev.Token))
		}
		if ev.Kind == EventPurgeBatch {
			attrs = append(attrs, slog.Int64("rows", ev.Rows))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.Any("err", ev.Err))
		}
		l.LogAttrs(ctx, level, "idem "+ev.Kind.String(), attrs...)
	})
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
