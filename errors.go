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
	// ErrFingerprintChanged reports a (Scope, Key) whose record was
	// fingerprinted in another way than the request ([FingerprintVersion]
	// differs): the server changed which parts of a request count (a
	// fingerprint selection of idemhttp, idemgrpc or the consumer
	// middleware) since the key was first used. The request may be an
	// honest retry or another request; it cannot be told, so nothing
	// runs. errors.Is(err, [ErrMismatch]) is true for it as well.
	// HTTP: 422, of its own problem type.
	ErrFingerprintChanged = fmt.Errorf("%w: the record's fingerprint was made with another selection of the request's fields", ErrMismatch)
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
	// ErrExpired reports a key that was used and whose response is gone:
	// past its retention, within its key memory (the request's or the
	// Store's: [Request.KeyMemory], [WithKeyMemory]), which the record
	// keeps as its forget time. Nothing ran, and nothing will for this
	// key until that time, whichever Store reads it or purges: it is
	// never retried automatically. A
	// request with the key and another payload is [ErrMismatch] instead.
	// HTTP: 410 Gone.
	ErrExpired = errors.New("idem: the key was used and its response is gone")
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

// errTxEnded is the Err of the error Do returns when its statement after
// fn, fenced on its claim's token, changed nothing: the claim this
// transaction made is gone. IsRetryable reports true for it.
var errTxEnded = errors.New("idem: the transaction was rolled back by the database")

// errContended is the Err of the error of a claim that lost maxContention
// races in a row. IsRetryable reports true for it: a retry of the
// transaction will see the winner's result.
var errContended = errors.New("idem: the key changed hands repeatedly while being claimed")

// Error is the error of one of idem's calls once its input was valid:
// what idem was doing, for which request and claim when it was about one
// key, why it failed, and apart from the message, what to do about it.
// errors.Is and errors.As see through it to Err, so a caller branches on
// the cause ([ErrMismatch], [ErrLeaseLost], [IsRetryable], the driver's
// own error) and logs the fields without parsing the message. An
// [*InFlightError] is returned as it is, and errors of the Store's
// configuration or of a request refused before any statement
// ([ErrInvalidKey], [ErrInvalidRequest]) are not Errors.
type Error struct {
	// Op is what idem was doing: "claim", "store the response",
	// "complete", "extend the lease", "release", "purge idempotency_keys",
	// "migrate idempotency_keys", ...
	Op string
	// Scope and Key are the request's, for an error about one key; both
	// are empty otherwise.
	Scope, Key string
	// Token is the fencing token of the claim the call was about; 0 for
	// a call that failed before it had one.
	Token int64
	// Err is why: a database error, one of idem's sentinels, or an Error
	// of a call this one made.
	Err error
	// Detail is what idem found, when Err's own text does not say it (a
	// sentinel's does not); "" otherwise.
	Detail string
	// Hint is what to do about it, for a person: a retry, a new key, a
	// table to create, a setting to change. It is not part of the
	// message.
	Hint string
	// retry is set when the Store's dialect read Err as retryable: a
	// dialect built outside idem, which IsRetryable does not ask.
	retry bool
}

// errRetryable is what an Error whose dialect read its Err as retryable
// is, to errors.Is: IsRetryable looks for it.
var errRetryable = errors.New("idem: retryable by the dialect")

// Is reports whether e is errRetryable.
func (e *Error) Is(target error) bool { return target == errRetryable && e.retry }

// Error reads "idem: Op for key K in scope S (token T): why", why being
// Detail, or else Err's text.
func (e *Error) Error() string { return "idem: " + e.text() }

// text is the message without the package's prefix, for an Error that
// another one wraps.
func (e *Error) text() string {
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Key != "" {
		fmt.Fprintf(&b, " for key %q in scope %q", e.Key, e.Scope)
	}
	if e.Token != 0 {
		fmt.Fprintf(&b, " (token %d)", e.Token)
	}
	b.WriteString(": ")
	if e.Detail != "" {
		b.WriteString(e.Detail)
	} else {
		b.WriteString(reason(e.Err))
	}
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// reason is err's text as the end of another Error's message: without
// the package's prefix when err is an Error.
func reason(err error) string {
	if e, ok := err.(*Error); ok {
		return e.text()
	}
	return err.Error()
}

// hintRollBack is the hint of the Errors of a statement inside a
// transaction; hintRetry (tx.go) that of those a retry may cure.
const hintRollBack = "roll back the transaction"

// errUnsafeSession is the Err of checkSession's refusals.
var errUnsafeSession = errors.New("idem: the transaction's settings would let a duplicate through")
