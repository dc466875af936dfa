package idemserve

import (
	"errors"
	"time"

	"github.com/idemkit/idem"
)

// Outcome is what an error of [Server.Serve] tells the client to do, for
// a layer to map to its status or code.
type Outcome struct {
	Kind Kind
	// RetryAfter is when to retry, for InFlight, TakenOver and
	// Contention.
	RetryAfter time.Duration
}

// Kind is the kind of an [Outcome].
type Kind int

const (
	// Internal: the server failed. Nothing was stored; the client may
	// retry with the same key. The layer logs the error and answers
	// without showing it.
	Internal Kind = iota
	// Mismatch: the key was already used for another request
	// ([idem.ErrMismatch]). Not to be retried: a new request needs a new
	// key.
	Mismatch
	// InFlight: another call holds the key ([idem.ErrInFlight]). Retry
	// after RetryAfter with the same key and request to get its result.
	InFlight
	// TakenOver: in ModeClaim, this call ran past its lease and a retry
	// took the key over ([idem.ErrLeaseLost]); nothing of it was stored.
	// Retry after RetryAfter to get the result of the call that took
	// over.
	TakenOver
	// InvalidKey: the key is malformed ([idem.ErrInvalidKey]).
	InvalidKey
	// Contention: the transaction kept failing with serialization
	// failures or deadlocks ([idem.IsRetryable]); nothing was stored.
	// Retry after RetryAfter with the same key.
	Contention
	// Expired: the key was used and its response is gone, past its
	// retention but within its key memory, the request's or the Store's,
	// which its record keeps ([idem.ErrExpired]).
	// Nothing ran. Not to be retried, by a client or a broker.
	Expired
)

// Outcome says what err, an error of Serve that is not the handler's
// own, tells the client.
func (s *Server) Outcome(err error) Outcome {
	var inFlight *idem.InFlightError
	switch {
	case errors.Is(err, idem.ErrMismatch):
		return Outcome{Kind: Mismatch}
	case errors.Is(err, idem.ErrExpired):
		return Outcome{Kind: Expired}
	case errors.Is(err, idem.ErrLeaseLost):
		return Outcome{Kind: TakenOver, RetryAfter: s.cfg.RetryAfter}
	case errors.As(err, &inFlight):
		return Outcome{Kind: InFlight, RetryAfter: min(s.cfg.RetryAfter, inFlight.RetryAfter)}
	case errors.Is(err, idem.ErrInvalidKey):
		return Outcome{Kind: InvalidKey}
	case idem.IsRetryable(err):
		return Outcome{Kind: Contention, RetryAfter: s.cfg.RetryAfter}
	}
	return Outcome{Kind: Internal}
}
