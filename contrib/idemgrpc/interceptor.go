package idemgrpc

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// MetadataKey is the metadata key that carries a call's idempotency key:
// its value is the key itself, 1 to 255 bytes of visible ASCII.
const MetadataKey = "idempotency-key"

// Interceptor is the configured interceptor; it is safe for concurrent
// use. Unary returns it as a grpc.UnaryServerInterceptor.
type Interceptor struct {
	cfg           Config
	noSideEffects map[string]bool
	replayable    map[string]bool       // metadata keys, lower case
	selections    map[string]*selection // by full method name
	core          *idemserve.Server
}

// Unary returns the server interceptor: calls of methods that have side
// effects are served as the package documentation describes; calls of
// the others ([Config.NoSideEffects], or declared
// idempotency_level = NO_SIDE_EFFECTS) reach the handler untouched.
//
//	grpc.NewServer(grpc.ChainUnaryInterceptor(auth, interceptor.Unary()))
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if i.noSideEffects[info.FullMethod] || declaredNoSideEffects(info.FullMethod) {
			return handler(ctx, req)
		}
		return i.serve(ctx, req, info.FullMethod, handler)
	}
}

// TxFrom returns the transaction the handler writes its rows through, or
// nil outside the interceptor and for a method that passes through. The
// handler must not commit or roll it back: the interceptor does.
//
// In [idemserve.ModeTransaction] the transaction is open before the handler runs. In
// [idemserve.ModeClaim] the first call of TxFrom begins it, so call it only once the
// slow work is done. TxFrom returns nil if it could not begin; the
// interceptor then rolls back and answers INTERNAL in place of the
// handler's answer.
//
// Behind an interceptor on another driver's Runner ([Config].Runner),
// TxFrom returns nil and begins nothing: the handler's transaction is
// that driver's (idempgx.TxFrom for pgx).
func TxFrom(ctx context.Context) *sql.Tx { return idemserve.SQLTxFrom(ctx) }

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the interceptor is running the handler for; ok is false
// when the call carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) { return idemserve.RequestFrom(ctx) }

// ClaimFrom returns the claim the interceptor holds for the call whose
// context is ctx: in [idemserve.ModeClaim], for a call with a key. Otherwise it
// returns nil. The handler uses its RelayKey, and may extend it for work
// longer than the Store's lease (Extend on the *sql.DB, ExtendOn on
// another driver's pool); the interceptor completes or releases it.
func ClaimFrom(ctx context.Context) *idem.Claim { return idemserve.ClaimFrom(ctx) }

// attemptError ends an attempt without storing anything: the handler
// answered a code that is not a result. Do passes it back unchanged and
// RunTx rolls back; it does not unwrap to the handler's error, so that
// RunTx does not run the handler again for it.
type attemptError struct{ answer *answer }

func (e *attemptError) Error() string {
	return fmt.Sprintf("idemgrpc: handler answered %v: %s", e.answer.status.Code(), e.answer.status.Message())
}

func (i *Interceptor) serve(ctx context.Context, req any, method string, handler grpc.UnaryHandler) (any, error) {
	key, present, err := i.keyOf(ctx, method, req)
	if err == nil && !present && i.cfg.Required {
		err = i.missingKey(method)
	}
	if err != nil {
		i.cfg.Store.Report(ctx, idem.Event{Kind: idem.EventInvalid, Key: key, Operation: operation(method), Err: err})
		return nil, err
	}
	call := idemserve.Call{Retry: retried(ctx)}
	if present {
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, i.fail(ctx, "fingerprint", method, key, fmt.Errorf("the request is a %T, not a protocol buffer message: idemgrpc fingerprints requests by their protobuf fields", req))
		}
		scope, err := i.cfg.Scope(ctx, req)
		if err != nil {
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, i.fail(ctx, "scope", method, key, err)
		}
		fp, err := i.fingerprint(method, msg.ProtoReflect())
		if err != nil {
			return nil, i.fail(ctx, "fingerprint", method, key, err)
		}
		call.Request = &idem.Request{Scope: scope, Key: key, Operation: operation(method), Fingerprint: fp}
		if i.cfg.Retention != nil {
			call.Request.Retention = i.cfg.Retention(method)
		}
		if i.cfg.KeyMemory != nil {
			call.Request.KeyMemory = i.cfg.KeyMemory(method)
		}
	}
	var fresh *answer
	call.Run = func(ctx context.Context) (idem.Response, error) {
		fresh = i.run(ctx, req, method, handler)
		if !i.isResult(fresh.status.Code()) {
			return idem.Response{}, &attemptError{answer: fresh}
		}
		if !present {
			return idem.Response{}, nil // nothing is stored
		}
		resp, err := fresh.response(i.keep)
		if err == nil && i.cfg.Reference != nil && fresh.status.Code() == codes.OK {
			resp.Reference = i.cfg.Reference(method, fresh.reply)
		}
		return resp, err
	}
	res, err := i.core.Serve(ctx, call)
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, status.FromContextError(ctx.Err()).Err() // the client went while its call waited for another with its key
	case err != nil:
		return nil, i.answerError(ctx, method, key, err)
	case res.Replayed:
		return i.replay(ctx, res.Response, method, key)
	}
	return fresh.send(ctx, false)
}

// operation is what a key is bound to: the full method name, or its
// SHA-256 when it is too long to store.
func operation(method string) string {
	if len(method) <= idem.MaxOperationLen {
		return method
	}
	sum := sha256.Sum256([]byte(method))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// run runs the handler with a recorder as its stream, and returns what
// it answered.
func (i *Interceptor) run(ctx context.Context, req any, method string, handler grpc.UnaryHandler) *answer {
	rec := &recorder{method: method}
	reply, err := handler(grpc.NewContextWithServerTransportStream(ctx, rec), req)
	return rec.answer(reply, err)
}

// isResult reports whether an answer with code is the call's result, to
// store and replay, or a failure of this attempt, rolled back so that a
// retry runs again: the codes that tell the client to retry are never
// stored, and the server-error codes only with StoreServerErrors.
func (i *Interceptor) isResult(code codes.Code) bool {
	switch code {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return true
	case codes.Unknown, codes.Internal, codes.DataLoss, codes.Unimplemented:
		return i.cfg.StoreServerErrors
	}
	return false // CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE, codes gRPC does not define
}

// keep reports whether the metadata key k is stored and replayed.
func (i *Interceptor) keep(k string) bool { return i.replayable[k] }

// replay answers a stored response: its status, its reply message and the
// metadata ReplayMetadata allows, marked idempotent-replayed: true.
func (i *Interceptor) replay(ctx context.Context, resp idem.Response, method, key string) (any, error) {
	a, err := answerOf(resp, protoregistry.GlobalTypes)
	if err != nil {
		return nil, i.fail(ctx, "replay", method, key, err)
	}
	for k := range a.header {
		if !i.keep(k) {
			delete(a.header, k)
		}
	}
	for k := range a.trailer {
		if !i.keep(k) {
			delete(a.trailer, k)
		}
	}
	return a.send(ctx, true)
}
