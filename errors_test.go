package idem

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// An Error reads as one sentence, names the request and the claim, ends
// with what to do, and lets errors.Is and errors.As reach its cause.
func TestErrorReads(t *testing.T) {
	cause := fmt.Errorf("%w: the key was taken over by another request, whose token is 7", ErrLeaseLost)
	e := &Error{Op: "complete", Scope: "tenant", Key: "k1", Token: 5, Err: cause, Next: "roll back this transaction"}
	want := `idem: complete for key "k1" in scope "tenant" (token 5): lease lost: the key was taken over by another request, whose token is 7; roll back this transaction`
	if e.Error() != want {
		t.Errorf("Error() = %q\nwant      %q", e.Error(), want)
	}
	if !errors.Is(fmt.Errorf("wrapped: %w", e), ErrLeaseLost) {
		t.Error("errors.Is does not reach ErrLeaseLost through an Error")
	}
	var got *Error
	if !errors.As(fmt.Errorf("wrapped: %w", e), &got) || got.Token != 5 || got.Scope != "tenant" {
		t.Errorf("errors.As: %+v", got)
	}
	bare := &Error{Op: "claim", Scope: "s", Key: "k", Err: errors.New("pq: boom")}
	if s := bare.Error(); s != `idem: claim for key "k" in scope "s": pq: boom` {
		t.Errorf("without token and advice: %q", s)
	}
}

// When Retry gives up, the last error no longer tells the caller to retry:
// it says Retry gave up, and keeps the cause and the request.
func TestGaveUpDropsTheAdviceToRetry(t *testing.T) {
	s, err := New(Postgres)
	if err != nil {
		t.Fatal(err)
	}
	last := s.stmtErr("claim", Request{Scope: "s", Key: "k"}, errContended)
	if !strings.Contains(last.Error(), nextRetry) {
		t.Fatalf("a retryable statement error does not advise a retry: %v", last)
	}
	err = gaveUp(maxAttempts, last)
	for _, want := range []string{"gave up after 10 attempts", `claim for key "k" in scope "s"`, "changed hands"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "run the whole transaction again") {
		t.Errorf("%q still advises running the transaction again", err)
	}
	if !IsRetryable(err) || !errors.Is(err, errContended) {
		t.Errorf("gaveUp hides its cause: %v", err)
	}
	if !strings.Contains(last.Error(), nextRetry) {
		t.Errorf("gaveUp changed the error it was given: %v", last)
	}
}

// A purge that failed after a retry gave up reads as one message: its
// context, then Retry's, without a second "idem: " between them.
func TestOpErrorHasOnePrefix(t *testing.T) {
	err := &opError{"purge keys", gaveUp(maxAttempts, errContended), "run it again"}
	if !strings.HasPrefix(err.Error(), "idem: purge keys: gave up after 10 attempts") {
		t.Errorf("%q does not read as one message", err)
	}
	if !errors.Is(err, errContended) {
		t.Errorf("%v hides its cause", err)
	}
}
