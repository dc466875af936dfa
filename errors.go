package idem

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidKey reports an Idempotency-Key that is empty, longer than
	// 255 bytes, or holds a byte outside visible ASCII (0x21..0x7E). A key is
	// never truncated or trimmed. HTTP: 400.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")
	// ErrInvalidRequest reports a Scope or Operation over 255 bytes, holding
	// NUL or not valid UTF-8, or a [Fingerprint] over 128 bytes; the message
	// names the field. HTTP: 400.
	ErrInvalidRequest = errors.New("idem: invalid request")
	// ErrMismatch reports a (Scope, Key) already used with another Operation
	// or [Fingerprint], whether that request completed or is still running.
	// HTTP: 422.
	ErrMismatch = errors.New("idem: idempotency key reused with a different request")
	// ErrInFlight reports that another live claim holds the key. The error
	// is an *InFlightError that says when to retry. HTTP: 409.
	ErrInFlight = errors.New("idem: a request with this idempotency key is in flight")
	// ErrLeaseLost reports that a [Claim] is no longer current: another
	// request took the key over after the lease ran out or after Release,
	// or the claim was already completed or released, or its record was
	// purged. Its completion, heartbeat or release changed nothing; the
	// message says which case it is. Roll back the transaction it was part
	// of.
	ErrLeaseLost = errors.New("idem: lease lost")
)

// InFlightError is returned while another live claim holds the key.
// errors.Is(err, [ErrInFlight]) reports true for it.
type InFlightError struct {
	// RetryAfter is the claim's remaining lease, by the database clock,
	// rounded up to a whole second (at least one second).
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrInFlight, e.RetryAfter)
}

// Is makes errors.Is(err, [ErrInFlight]) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

func inFlight(leaseLeft time.Duration) *InFlightError {
	secs := (leaseLeft + time.Second - 1) / time.Second
	return &InFlightError{RetryAfter: max(secs, 1) * time.Second}
}

// errTxEnded is wrapped by the error Do returns when its statement after
// fn, fenced on its claim's token, changed nothing: the claim this
// transaction made is gone. IsRetryable reports true for it.
var errTxEnded = errors.New("idem: the transaction was rolled back by the database")

// errContended is returned when acquire lost maxContention races in a row.
// IsRetryable reports true for it: a retry of the transaction will see the
// winner's result.
var errContended = errors.New("idem: the key changed hands repeatedly while being claimed; retry the transaction")
