package idemgrpc

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keygate"
)

// MetadataKey is the metadata key that carries a call's idempotency key:
// its value is the key itself, 1 to 255 bytes of visible ASCII.
const MetadataKey = "idempotency-key"

// Interceptor is the configured interceptor; it is safe for concurrent
// use. Unary returns it as a grpc.UnaryServerInterceptor.
type Interceptor struct {
	cfg           Config
	noSideEffects map[string]bool
	replayable    map[string]bool // metadata keys, lower case
	gate          keygate.Gate    // ModeTransaction: one call per key at the database
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
	var r *idem.Request
	work := ctx
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
		r = &idem.Request{Scope: scope, Key: key, Operation: operation(method), Fingerprint: fingerprint(method, msg.ProtoReflect())}
		ctx = context.WithValue(ctx, requestKey, *r)
		if i.cfg.Mode == ModeTransaction {
			leave, err := i.wait(ctx, *r)
			if err != nil {
				return nil, err
			}
			defer leave()
		}
		// From here the call holds its key: the work is not cancelled when
		// the client goes, so that it finishes and its result is stored
		// for the client's retry, but it is bounded.
		var cancel context.CancelFunc
		work, cancel = context.WithTimeout(context.WithoutCancel(ctx), i.cfg.Timeout)
		defer cancel()
		if retried(ctx) {
			work = idem.WithRetryHint(work)
		}
	}
	if i.cfg.Mode == ModeClaim {
		return i.serveClaim(ctx, work, req, method, r, handler)
	}
	return i.serveTx(ctx, work, req, method, r, handler)
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

// wait lets the call through the gate of its key once no other call with
// that key in this process is at the database, so that it waits in
// memory, not on a pooled connection, as long as a duplicate in another
// process waits on the row lock (keygate), and then answers as that
// duplicate would, UNAVAILABLE; it gives up at once when the client goes.
func (i *Interceptor) wait(ctx context.Context, r idem.Request) (leave func(), err error) {
	leave, err = i.gate.Wait(ctx, i.cfg.Store, r, i.cfg.Timeout, i.cfg.RetryAfter)
	if err == nil {
		return leave, nil
	}
	i.cfg.Store.Report(ctx, idem.Event{Kind: idem.EventInFlight, Scope: r.Scope, Key: r.Key, Operation: r.Operation})
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, i.answerError(ctx, r.Operation, r.Key, err)
}

// serveTx runs the handler inside Store.Do, in a transaction RunTx opens
// and retries.
func (i *Interceptor) serveTx(ctx, work context.Context, req any, method string, r *idem.Request, handler grpc.UnaryHandler) (any, error) {
	var (
		fresh *answer
		res   idem.Result
	)
	err := idem.RunTx(work, i.cfg.DB, i.cfg.TxOptions, func(tx *sql.Tx) error {
		run := func(ctx context.Context) (idem.Response, error) {
			fresh = i.run(ctx, req, method, handler, &txHolder{tx: tx})
			if !i.isResult(fresh.status.Code()) {
				return idem.Response{}, &attemptError{answer: fresh}
			}
			if r == nil {
				return idem.Response{}, nil
			}
			return fresh.response(i.keep)
		}
		if r == nil {
			_, err := run(work)
			return err
		}
		var err error
		res, err = i.cfg.Store.Do(work, tx, *r, run)
		return err
	})
	switch {
	case err != nil:
		return nil, i.answerError(ctx, method, keyIn(r), err)
	case res.Replayed:
		return i.replay(ctx, res.Response, method, r.Key)
	}
	return fresh.send(ctx, false)
}

// keyIn is r's key, "" without one.
func keyIn(r *idem.Request) string {
	if r == nil {
		return ""
	}
	return r.Key
}

// run runs the handler with h as its transaction and a recorder as its
// stream, and returns what it answered.
func (i *Interceptor) run(ctx context.Context, req any, method string, handler grpc.UnaryHandler, h *txHolder) *answer {
	rec := &recorder{method: method}
	reply, err := handler(grpc.NewContextWithServerTransportStream(context.WithValue(ctx, txKey, h), rec), req)
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
