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
	// RetryAfter is when to retry, for InFlight, LeaseLost, Contention
	// and NotReplicated.
	RetryAfter time.Duration
	// KeyID names the key the record is sealed with, for Unsealable.
	KeyID string
	// Reference is what the key's first request created, for Expired:
	// the reference its record kept ([idem.Response.Reference],
	// [idem.ExpiredError]), for the client to fetch; "" when it kept
	// none, or when a sealed one could not be opened (logged).
	Reference string
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
	// LeaseLost: in ModeClaim, this call ran past its lease and a retry
	// took the key over ([idem.ErrLeaseLost]); nothing of it was stored.
	// Retry after RetryAfter to get the result of the call that took
	// over.
	LeaseLost
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
	// Reference says what the first request created, when it recorded it.
	Expired
	// FingerprintChanged: the key was used, and its record was
	// fingerprinted with another selection of the request's fields than
	// this request ([idem.ErrFingerprintChanged]): the server's selection
	// changed since. Nothing ran. Not to be retried with this key.
	FingerprintChanged
	// Unsealable: the key's record completed, but its stored response
	// cannot be opened ([idem.ErrUnsealable]): it is sealed with a key
	// (KeyID) this process's sealer lacks, or it was changed. Nothing
	// ran again. A server fault that a retry cannot cure until the key
	// is deployed: the layer answers without inviting a retry (idemhttp:
	// 501, which idemclient does not retry; idemgrpc: INTERNAL; the
	// consumer acks a redelivery, which was applied). The Server logs it
	// once per key ID, with the fix.
	Unsealable
	// NotReplicated: with [Config.Standbys], the answer was decided and
	// committed, but its commit had not reached the standbys within
	// [Config.StandbyWait] ([idem.ErrNotReplicated]), so a failover could
	// still lose it. The outcome is unknown: retry after RetryAfter with
	// the same key and request, which replays the answer if it survived
	// and runs the call again if it did not.
	NotReplicated
)

// The names of v0.1.0, before each Kind took the name of the idem error
// it stands for.
//
// Deprecated: use LeaseLost for TakenOver ([idem.ErrLeaseLost]) and
// Unsealable for Unopenable ([idem.ErrUnsealable]).
const (
	TakenOver  = LeaseLost
	Unopenable = Unsealable
)

// Outcome says what err, an error of Serve that is not the handler's
// own, tells the client. For Unsealable it logs err, the first time
// only for each key ID.
func (s *Server) Outcome(err error) Outcome {
	var inFlight *idem.InFlightError
	switch {
	case errors.Is(err, idem.ErrFingerprintChanged):
		return Outcome{Kind: FingerprintChanged}
	case errors.Is(err, idem.ErrNotReplicated):
		return Outcome{Kind: NotReplicated, RetryAfter: s.cfg.RetryAfter}
	case errors.Is(err, idem.ErrMismatch):
		return Outcome{Kind: Mismatch}
	case errors.Is(err, idem.ErrExpired):
		o := Outcome{Kind: Expired}
		if e, ok := errors.AsType[*idem.ExpiredError](err); ok {
			o.Reference = e.Reference
			if e.ReferenceErr != nil {
				s.cfg.Logger.Warn(s.cfg.Layer+": the reference kept with an expired key cannot be opened: the refusal goes without it",
					"err", err, "reference_err", e.ReferenceErr,
					"fix", "give the Store a sealer that has the key it was sealed with (idem.WithSealer); see docs/operations.md, Sealing")
			}
		}
		return o
	case errors.Is(err, idem.ErrUnsealable):
		keyID := ""
		if u, ok := errors.AsType[*idem.UnsealableError](err); ok {
			keyID = u.KeyID
		}
		if _, logged := s.unopenable.LoadOrStore(keyID, struct{}{}); !logged {
			s.cfg.Logger.Error(s.cfg.Layer+": a stored response cannot be opened: no record sealed with this key replays (nor runs again) until it is fixed",
				"key_id", keyID, "err", err,
				"fix", "give the Store a sealer that has this key (idem.WithSealer with idem.NewAESGCMSealer's keys, idem.ParseKeys), in every process; drop a key only after idem reseal has rewritten its records; see docs/operations.md, Sealing")
		}
		return Outcome{Kind: Unsealable, KeyID: keyID}
	case errors.Is(err, idem.ErrLeaseLost):
		return Outcome{Kind: LeaseLost, RetryAfter: s.cfg.RetryAfter}
	case errors.As(err, &inFlight):
		return Outcome{Kind: InFlight, RetryAfter: min(s.cfg.RetryAfter, inFlight.RetryAfter)}
	case errors.Is(err, idem.ErrInvalidKey):
		return Outcome{Kind: InvalidKey}
	case idem.IsRetryable(err):
		return Outcome{Kind: Contention, RetryAfter: s.cfg.RetryAfter}
	}
	return Outcome{Kind: Internal}
}
