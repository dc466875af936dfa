package idem

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// An Error reads as one sentence that names the request and the claim,
// keeps what to do apart in its Hint, and lets errors.Is and errors.As
// reach its cause.
func TestErrorReads(t *testing.T) {
	e := &Error{Op: "complete", Scope: "tenant", Key: "k1", Token: 5, Err: ErrLeaseLost,
		Detail: "lease lost: the key was taken over by another request, whose token is 7", Hint: "roll back this transaction"}
	want := `idem: complete for key "k1" in scope "tenant" (token 5): lease lost: the key was taken over by another request, whose token is 7`
	if e.Error() != want {
		t.Errorf("Error() = %q\nwant      %q", e.Error(), want)
	}
	if !errors.Is(fmt.Errorf("wrapped: %w", e), ErrLeaseLost) {
		t.Error("errors.Is does not reach ErrLeaseLost through an Error")
	}
	var got *Error
	if !errors.As(fmt.Errorf("wrapped: %w", e), &got) || got.Token != 5 || got.Scope != "tenant" || got.Hint != "roll back this transaction" {
		t.Errorf("errors.As: %+v", got)
	}
	bare := &Error{Op: "claim", Scope: "s", Key: "k", Err: errors.New("pq: boom")}
	if s := bare.Error(); s != `idem: claim for key "k" in scope "s": pq: boom` {
		t.Errorf("without token and detail: %q", s)
	}
	keyless := &Error{Op: "purge t", Err: errors.New("pq: boom")}
	if s := keyless.Error(); s != `idem: purge t: pq: boom` {
		t.Errorf("without a key: %q", s)
	}
}

// When Retry gives up, its error says so, carries the last error's
// message and request inside its own with one "idem: " prefix, no longer
// hints at a retry, and keeps the cause reachable.
func TestGaveUpKeepsTheCause(t *testing.T) {
	last := &Error{Op: "claim", Scope: "s", Key: "k", Err: errContended, Detail: "the key changed hands repeatedly", Hint: hintRetry}
	err := gaveUp(maxAttempts, last)
	for _, want := range []string{"idem: run the transaction: gave up after 10 attempts", `claim for key "k" in scope "s"`, "changed hands"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if n := strings.Count(err.Error(), "idem: "); n != 1 {
		t.Errorf("%q has %d prefixes", err, n)
	}
	if err.(*Error).Hint != "" {
		t.Errorf("gaveUp hints %q", err.(*Error).Hint)
	}
	if !IsRetryable(err) || !errors.Is(err, errContended) {
		t.Errorf("gaveUp hides its cause: %v", err)
	}
}

// A purge that failed after a retry gave up reads as one message: its
// context, then Retry's, without a second "idem: " between them.
func TestNestedErrorsHaveOnePrefix(t *testing.T) {
	inner := gaveUp(maxAttempts, errors.New("pq: deadlock detected"))
	err := &Error{Op: "purge keys", Err: inner, Detail: "stopped after deleting 3 records: " + reason(inner), Hint: "run it again"}
	if want := "idem: purge keys: stopped after deleting 3 records: run the transaction: gave up after 10 attempts"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("%q does not start %q", err, want)
	}
	if strings.Count(err.Error(), "idem: ") != 1 {
		t.Errorf("%q has more than one prefix", err)
	}
}
