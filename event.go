package idem

import (
	"context"
	"errors"
	"time"
)

// EventKind is the outcome an [Event] reports.
type EventKind int

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
