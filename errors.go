package idem

import (
	"errors"
	"fmt"
	"strings"
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

// Error is the error of one of idem's calls about one key, once the
// request was valid: what idem was doing, for which request and claim, why
// it failed, and what to do about it. errors.Is and errors.As see through
// it to Err, so a caller branches as before ([ErrMismatch], [ErrLeaseLost],
// [IsRetryable], the driver's own error) and logs the fields without
// parsing the message. An [*InFlightError] is returned as it is, and
// errors of the Store's configuration or of a request refused before any
// statement ([ErrInvalidKey], [ErrInvalidRequest]) are not Errors: they
// concern no record.
type Error struct {
	// Op is what idem was doing: "claim", "store the response",
	// "complete", "extend the lease", "release", ...
	Op string
	// Scope and Key are the request's.
	Scope, Key string
	// Token is the fencing token of the claim the call was about; 0 for
	// a call that failed before it had one.
	Token int64
	// Err is why: a database error, ErrMismatch, ErrLeaseLost, or idem's
	// report that the database ended the transaction.
	Err error
	// Next is what to do about it, as the message ends.
	Next string
}

// Error reads "idem: Op for key K in scope S (token T): Err; Next".
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem: %s for key %q in scope %q", e.Op, e.Key, e.Scope)
	if e.Token != 0 {
		fmt.Fprintf(&b, " (token %d)", e.Token)
	}
	b.WriteString(": ")
	b.WriteString(strings.TrimPrefix(e.Err.Error(), "idem: "))
	if e.Next != "" {
		b.WriteString("; ")
		b.WriteString(e.Next)
	}
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// What to do next, as Errors end.
const (
	nextRollBack = "roll back the transaction"
	nextRetry    = "roll back and run the whole transaction again (RunTx and Retry do so)"
)

// opError is err after what idem was doing and before what to do next,
// read as one message with one "idem: " prefix: err's own (Retry's, when
// it gave up) is dropped from the middle. errors.Is and errors.As reach
// err.
type opError struct {
	what string
	err  error
	next string
}

func (e *opError) Error() string {
	return "idem: " + e.what + ": " + strings.TrimPrefix(e.err.Error(), "idem: ") + "; " + e.next
}

func (e *opError) Unwrap() error { return e.err }

// fixFor is what a dialect says to change for err, or "", asking every
// dialect as IsRetryable does.
func fixFor(err error) string {
	for _, d := range dialects {
		if fix := d.fix(err); fix != "" {
			return fix
		}
	}
	return ""
}
