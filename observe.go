package idem

import (
	"context"
	"errors"
	"log/slog"
)

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

// observeDo reports the outcome of a Do that began at start and returns
// res, err. It is deferred by Do, so that every return reports once.
func (s *Store) observeDo(ctx context.Context, req Request, start stopwatch, res *Result, err *error) {
	if s.observer == nil {
		return
	}
	done, e := EventExecuted, *err
	switch {
	case e == nil && res.StatusCode == 0:
		e = ErrPanicked // every return with a nil error carries a valid status
	case res.Replayed:
		done = EventReplayed
	}
	s.observeErr(ctx, Event{Kind: done, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed()}, e)
}
