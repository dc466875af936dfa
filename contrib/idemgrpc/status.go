package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem/idemserve"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo that every error
// of the interceptor itself carries, beside one of the Reason constants
// (AIP-193). docs/grpc.md says what each means and what to do.
const ErrorDomain = "github.com/idemkit/idem"

// The reasons of the interceptor's errors, in their ErrorInfo.
const (
	// ReasonMissingKey (INVALID_ARGUMENT): [Config.Required] is set and the
	// call has no key. Send a new unique key with each new request.
	ReasonMissingKey = "IDEMPOTENCY_KEY_MISSING"
	// ReasonInvalidKey (INVALID_ARGUMENT): the key is empty, over 255
	// bytes or not visible ASCII, or the call carries two metadata values
	// of it, or a KeyField and metadata that differ.
	ReasonInvalidKey = "IDEMPOTENCY_KEY_INVALID"
	// ReasonMismatch (FAILED_PRECONDITION): the key was already used in
	// this scope for another request (another method or message). Do not
	// retry: a new request needs a new key.
	ReasonMismatch = "IDEMPOTENCY_KEY_REUSED"
	// ReasonExpired (FAILED_PRECONDITION): the key was used and its
	// stored answer is gone: its retention has passed, and the server
	// keeps the key for its key memory (idem.WithKeyMemory) so that the
	// call does not run a second time. Nothing ran. Do not retry with
	// this key. When the call recorded what it created
	// ([Config].Reference), the ErrorInfo's metadata holds it under
	// "reference": get that resource instead.
	ReasonExpired = "IDEMPOTENCY_KEY_EXPIRED"
	// ReasonFingerprintChanged (FAILED_PRECONDITION): the key was used
	// before the server changed which fields of the method's request count
	// ([Config].FingerprintFields, FingerprintIgnore), so it cannot tell a
	// retry from another request. Nothing ran. Do not retry with this key:
	// look the outcome up another way, or send a new request with a new
	// key.
	ReasonFingerprintChanged = "IDEMPOTENCY_FINGERPRINT_CHANGED"
	// ReasonInFlight (UNAVAILABLE, with RetryInfo): another call holds the
	// key. Retry with the same key and request to get its result.
	ReasonInFlight = "IDEMPOTENCY_KEY_IN_FLIGHT"
	// ReasonLeaseLost (UNAVAILABLE, with RetryInfo): in
	// [idemserve.ModeClaim], this call ran past its lease and a retry took
	// the key over (idem.ErrLeaseLost); nothing of it was stored. Retry to
	// get the result of the call that took over.
	ReasonLeaseLost = "IDEMPOTENCY_KEY_TAKEN_OVER"
	// ReasonContention (UNAVAILABLE, with RetryInfo): the transaction kept
	// failing with serialization failures or deadlocks. Nothing was
	// stored; retry with the same key.
	ReasonContention = "IDEMPOTENCY_CONTENTION"
	// ReasonUnsealable (INTERNAL): the key's call completed, but the
	// server cannot open the answer it stored: it is sealed with a key
	// this server lacks (idem.ErrUnsealable), a fault of its deployment
	// that it logs. The call did not run again. A retry will not succeed
	// until the server is fixed: INTERNAL, which gRPC's retry policies do
	// not retry unless told to, and a message that says not to.
	ReasonUnsealable = "IDEMPOTENCY_RECORD_UNOPENABLE"
	// ReasonNotReplicated (UNAVAILABLE, with RetryInfo): with
	// [Config.Standbys], the call's answer was committed on the primary
	// but had not reached the standbys within [Config.StandbyWait], so a
	// failover could still lose it. The outcome is unknown: retry with
	// the same key and request, which replays the answer if it survived
	// and runs the call again if it did not.
	ReasonNotReplicated = "IDEMPOTENCY_NOT_REPLICATED"
	// ReasonInternal (INTERNAL): the server failed; the error is logged to
	// [Config.Logger], not shown. Nothing was stored; retry with the same
	// key.
	ReasonInternal = "IDEMPOTENCY_INTERNAL"
)

// The names of v0.1.0, before each reason took the name of the idem
// error it stands for. Their values, what a client sees, are unchanged.
//
// Deprecated: use ReasonMismatch, ReasonExpired, ReasonLeaseLost and
// ReasonUnsealable.
const (
	ReasonKeyReused  = ReasonMismatch
	ReasonKeyExpired = ReasonExpired
	ReasonTakenOver  = ReasonLeaseLost
	ReasonUnopenable = ReasonUnsealable
)

// statusError is an error of the interceptor: code and message, an
// ErrorInfo with reason, then details.
func statusError(code codes.Code, reason, msg string, details ...protoadapt.MessageV1) error {
	return statusErrorWith(code, reason, msg, nil, details...)
}

// statusErrorWith is statusError whose ErrorInfo carries metadata.
func statusErrorWith(code codes.Code, reason, msg string, metadata map[string]string, details ...protoadapt.MessageV1) error {
	st := status.New(code, msg)
	withInfo, err := st.WithDetails(append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: metadata}}, details...)...)
	if err != nil { // the details are messages of errdetails, which always marshal
		panic(err)
	}
	return withInfo.Err()
}

// retryLater is UNAVAILABLE with a RetryInfo of wait, and sets the
// grpc-retry-pushback-ms trailer that gRPC's retry policy obeys, so that
// a client whose service config retries UNAVAILABLE waits as long before
// its next attempt.
func retryLater(ctx context.Context, wait time.Duration, reason, msg string) error {
	if s := grpc.ServerTransportStreamFromContext(ctx); s != nil {
		_ = s.SetTrailer(metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(wait.Milliseconds(), 10)))
	}
	return statusError(codes.Unavailable, reason, msg, &errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
}

// answerError is what the interceptor answers for an error of serving a
// call with key: a status whose code says what the client should do next.
// ctx is the call's own context, whose stream gets the trailer.
func (i *Interceptor) answerError(ctx context.Context, method, key string, err error) error {
	if attempt, ok := errors.AsType[*attemptError](err); ok {
		_, err := attempt.answer.send(ctx, false)
		return err
	}
	switch o := i.core.Outcome(err); o.Kind {
	case idemserve.Mismatch:
		return statusError(codes.FailedPrecondition, ReasonMismatch,
			fmt.Sprintf("idempotency key %q was already used for a different request (another method, or another request message); a retry must repeat the request exactly, and a new request needs a new key", key),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: ReasonMismatch, Subject: i.keySubject(), Description: "the idempotency key belongs to another request"}}})
	case idemserve.FingerprintChanged:
		return statusError(codes.FailedPrecondition, ReasonFingerprintChanged,
			fmt.Sprintf("idempotency key %q was used before the server changed which fields of this method's request it compares, so it cannot tell whether this call repeats that one; the call did not run; do not retry with this key: look the outcome up another way, or send a new request with a new key", key),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: ReasonFingerprintChanged, Subject: i.keySubject(), Description: "the idempotency key was fingerprinted with another selection of the request's fields"}}})
	case idemserve.Expired:
		msg := fmt.Sprintf("idempotency key %q was used, and its stored answer is gone: its retention has passed; the call did not run again; do not retry with this key", key)
		var meta map[string]string
		if o.Reference != "" {
			msg += fmt.Sprintf("; it created %s (the ErrorInfo's metadata \"reference\"): get that instead", o.Reference)
			meta = map[string]string{"reference": o.Reference}
		}
		return statusErrorWith(codes.FailedPrecondition, ReasonExpired, msg, meta,
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: ReasonExpired, Subject: i.keySubject(), Description: "the idempotency key's answer is gone"}}})
	case idemserve.Unsealable:
		return statusError(codes.Internal, ReasonUnsealable,
			fmt.Sprintf("%s was used, and its call completed, but this server cannot read the answer it stored (a key it was sealed with is not deployed here); the call did not run again; a retry will not succeed until the server is fixed: do not retry automatically", callWith(key)))
	case idemserve.LeaseLost:
		return retryLater(ctx, o.RetryAfter, ReasonLeaseLost,
			fmt.Sprintf("%s ran past its lease and a retry took it over; nothing of this attempt was stored; retry with the same key to get that call's result", callWith(key)))
	case idemserve.InFlight:
		return retryLater(ctx, o.RetryAfter, ReasonInFlight,
			fmt.Sprintf("a call with idempotency key %q is still being processed; retry after %v with the same key and request to get its result", key, o.RetryAfter))
	case idemserve.InvalidKey:
		return i.invalidKey(err.Error())
	case idemserve.Contention:
		return retryLater(ctx, o.RetryAfter, ReasonContention,
			fmt.Sprintf("the transaction of %s kept failing with serialization failures or deadlocks and was rolled back; nothing was stored; retry it", callWith(key)))
	case idemserve.NotReplicated:
		return retryLater(ctx, o.RetryAfter, ReasonNotReplicated,
			fmt.Sprintf("the answer of %s is stored on the primary database but has not yet reached its standbys, so a failover could still lose it; its outcome is unknown: retry with the same key and request, which returns that answer if it survived, or runs the call again if it did not", callWith(key)))
	}
	return i.fail(ctx, "transaction", method, key, err)
}

// callWith describes the call with key, for messages.
func callWith(key string) string {
	if key == "" {
		return "the call"
	}
	return fmt.Sprintf("the call with idempotency key %q", key)
}

// fail logs err and answers INTERNAL.
func (i *Interceptor) fail(ctx context.Context, stage, method, key string, err error) error {
	i.core.Logger().ErrorContext(ctx, "idemgrpc: call failed", "stage", stage, "method", method, "key", key, "err", err)
	return statusError(codes.Internal, ReasonInternal,
		"the call failed on the server and was rolled back; nothing was stored; retry with the same idempotency key")
}

// invalidKey is INVALID_ARGUMENT for a malformed key.
func (i *Interceptor) invalidKey(why string) error {
	return statusError(codes.InvalidArgument, ReasonInvalidKey, "invalid idempotency key: "+why,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: i.keySubject(), Description: why, Reason: ReasonInvalidKey}}})
}

// missingKey is INVALID_ARGUMENT for a call without a key.
func (i *Interceptor) missingKey(method string) error {
	why := fmt.Sprintf("%s requires an idempotency key in the %s metadata", method, MetadataKey)
	if i.cfg.KeyField != "" {
		why = fmt.Sprintf("%s requires an idempotency key in the request's %s field or the %s metadata", method, i.cfg.KeyField, MetadataKey)
	}
	why += ": send a new unique key (e.g. a UUID) with each new request, and the same key when you retry it"
	return statusError(codes.InvalidArgument, ReasonMissingKey, why,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: i.keySubject(), Description: why, Reason: ReasonMissingKey}}})
}

// keySubject names where the key comes from, for the details.
func (i *Interceptor) keySubject() string {
	if i.cfg.KeyField != "" {
		return i.cfg.KeyField
	}
	return MetadataKey
}
