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
	// NUL or not valid UTF-8, or a Fingerprint over 128 bytes; the message
	// names the field. HTTP: 400.
	ErrInvalidRequest = errors.New("idem: invalid request")
	// ErrMismatch reports a (Scope, Key) already used with another Operation
	// or Fingerprint, whether that request completed or is still running.
	// HTTP: 422.
	ErrMismatch = errors.New("idem: idempotency key reused with a different request")
	// ErrInFlight reports that another live claim holds the key. The error
	// is an *InFlightError that says when to retry. HTTP: 409.
	ErrInFlight = errors.New("idem: a request with this idempotency key is in flight")
	// ErrLeaseLost reports that a Claim is no longer current: another
	// request took the key over after the lease ran out or after Release,
	// or the claim was already completed or released, or its record was
	// purged. Its completion, heartbeat or release changed nothing; the
	// message says which case it is. Roll back the transaction it was part
	// of.
	ErrLeaseLost = errors.New("idem: lease lost")
)

// InFlightError is returned while another live claim holds the key.
// errors.Is(err, ErrInFlight) reports true for it.
type InFlightError struct {
	// RetryAfter is the claim's remaining lease, by the database clock,
	// rounded up to a whole second (at least one second).
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrInFlight, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInFlight) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

func inFlight(leaseLeft time.Duration) *InFlightError {
	secs := (leaseLeft + time.Second - 1) / time.Second
	return &InFlightError{RetryAfter: max(secs, 1) * time.Second}
}

// errTxEnded is wrapped by the error Do returns when its statement after
// fn, fenced on its claim's token, changed nothing: the claim this
// transaction made is gone. IsRetryable reports true for it.
var errTxEnded = errors.New("idem: the transaction was rolled back by the database")

// txEnded reports that Do's statement after fn (what) found no claim of
// its own to change, wrapping cause (fn's error) when there is one. MySQL
// and SQLite end a transaction whole at a deadlock, a lock wait timeout
// with innodb_rollback_on_timeout, or an interrupted write, while the
// *sql.Tx stays open: the statement then ran on its own and, fenced on the
// token, changed nothing. A retry of the whole transaction replays the
// result of whoever holds the key now, or runs again.
func txEnded(what string, req Request, cause error) error {
	const why = "the claim this transaction made is gone: the database ended the transaction " +
		"(a deadlock or an interrupted statement does so on MySQL and SQLite while the *sql.Tx stays open), " +
		"or a statement in it deleted or changed the claim"
	const next = "roll back and retry (RunTx does this): the retry replays the result of whoever holds the key now, or runs again"
	if cause != nil {
		return fmt.Errorf("%w: %s for key %q in scope %q changed nothing; %s; fn's error: %w; %s", errTxEnded, what, req.Key, req.Scope, why, cause, next)
	}
	return fmt.Errorf("%w: %s for key %q in scope %q changed nothing; %s; %s", errTxEnded, what, req.Key, req.Scope, why, next)
}

// stmtErr reports that one of idem's statements failed: what idem was
// doing, for which key, the database's error, and what to do next.
func stmtErr(what string, req Request, err error) error {
	next := "roll back the transaction"
	if IsRetryable(err) {
		next = "roll back and run the whole transaction again (RunTx does this)"
	}
	return fmt.Errorf("idem: %s for key %q in scope %q: %w; %s", what, req.Key, req.Scope, err, next)
}

// errContended is returned when acquire lost maxContention races in a row.
// IsRetryable reports true for it: a retry of the transaction will see the
// winner's result.
var errContended = errors.New("idem: the key changed hands repeatedly while being claimed; retry the transaction")

func mismatch(req Request, rec record) error {
	what := "payload (Fingerprint)"
	if rec.operation != req.Operation {
		what = fmt.Sprintf("operation %q", rec.operation)
	}
	return fmt.Errorf("%w: key %q in scope %q was first used with another %s; use a new key for a new request", ErrMismatch, req.Key, req.Scope, what)
}
