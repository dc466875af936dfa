package idemgrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/idemclient"
)

// ClientOption configures [UnaryClientInterceptor].
type ClientOption func(*clientConfig)

type clientConfig struct {
	keyField      string
	noSideEffects map[string]bool
}

// WithKeyField makes the client interceptor use the request's string
// field name as the key as well, as AIP-4235 asks of client libraries for
// AIP-155's request_id: a request that has the field set is sent with its
// value as the key; one that has it empty is sent as a copy with the key
// filled in (the caller's message is not changed). Requests without the
// field are not affected.
func WithKeyField(name string) ClientOption {
	return func(c *clientConfig) { c.keyField = name }
}

// WithNoSideEffects lists full method names ("/payments.v1.Payments/GetCharge")
// that the client interceptor calls untouched, without a key, besides
// those whose descriptor declares idempotency_level = NO_SIDE_EFFECTS.
func WithNoSideEffects(methods ...string) ClientOption {
	return func(c *clientConfig) {
		for _, m := range methods {
			c.noSideEffects[m] = true
		}
	}
}

// UseKey is a grpc.CallOption that sends the call with the key *key, or,
// when *key is empty, with the key the interceptor generates, which it
// stores in *key: so the caller learns the key, and passing the same
// variable to the next call (an application-level retry) sends the same
// key again.
//
//	var key string // one per logical request
//	for attempt := range 5 {
//		reply, err = client.Charge(ctx, req, idemgrpc.UseKey(&key))
//		...
//	}
func UseKey(key *string) grpc.CallOption { return useKey{key: key} }

type useKey struct {
	grpc.EmptyCallOption
	key *string
}

// NewKey returns a new random key, a version 4 UUID from crypto/rand, the
// same as idemclient.NewKey.
func NewKey() string { return idemclient.NewKey() }

// UnaryClientInterceptor returns a client interceptor that sends every
// call of a method with side effects with an idempotency key in the
// [MetadataKey] metadata: the one the call's context already carries
// (metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)), the
// one given with [UseKey], the request's key field ([WithKeyField]), or
// else a new random one ([NewKey]). Where several are given they must be
// equal, or the call fails with INVALID_ARGUMENT before it is sent.
//
// The metadata is set once per call, before gRPC's own retries (a retry
// policy in the service config, transparent retries), so every attempt
// carries the same key; an application that retries a call itself keeps
// its key with [UseKey] or in the context. Methods declared
// idempotency_level = NO_SIDE_EFFECTS, or listed with
// [WithNoSideEffects], are called untouched.
//
//	conn, err := grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()),
//		grpc.WithDefaultServiceConfig(retryPolicy))
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := &clientConfig{noSideEffects: map[string]bool{}}
	for _, o := range opts {
		o(c)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if c.noSideEffects[method] || declaredNoSideEffects(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		key, req, inMetadata, err := c.key(ctx, req, callOpts)
		if err != nil {
			return err
		}
		if !inMetadata {
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// key returns the call's key, the request to send (a copy with the key
// field filled in, or req), and whether the context's metadata has the
// key already.
func (c *clientConfig) key(ctx context.Context, req any, callOpts []grpc.CallOption) (key string, send any, inMetadata bool, err error) {
	var (
		given   []string // each key given, and where
		sources []string
		slot    *string
	)
	md := metadata.ValueFromOutgoingContext(ctx, MetadataKey)
	if len(md) > 1 {
		return "", nil, false, status.Errorf(codes.InvalidArgument, "idemgrpc: the call's context carries %d %s metadata values; set one", len(md), MetadataKey)
	}
	if len(md) == 1 {
		given, sources, inMetadata = append(given, md[0]), append(sources, "the context's metadata"), true
	}
	for _, o := range callOpts {
		if u, ok := o.(useKey); ok && u.key != nil {
			slot = u.key
		}
	}
	if slot != nil && *slot != "" {
		given, sources = append(given, *slot), append(sources, "UseKey")
	}
	var (
		pm protoreflect.Message
		fd protoreflect.FieldDescriptor
	)
	if c.keyField != "" {
		if pm, fd, err = keyField(req, c.keyField); err != nil {
			return "", nil, false, status.Error(codes.InvalidArgument, err.Error())
		}
		if pm != nil && pm.Get(fd).String() != "" {
			given, sources = append(given, pm.Get(fd).String()), append(sources, "the request's "+c.keyField)
		}
	}
	for j := 1; j < len(given); j++ {
		if given[j] != given[0] {
			return "", nil, false, status.Errorf(codes.InvalidArgument, "idemgrpc: the call has two idempotency keys: %q from %s and %q from %s; give one, or the same in each place", given[0], sources[0], given[j], sources[j])
		}
	}
	if len(given) > 0 {
		key = given[0]
	} else {
		key = NewKey()
	}
	if slot != nil {
		*slot = key
	}
	send = req
	if pm != nil && pm.Get(fd).String() == "" {
		m := proto.Clone(pm.Interface())
		m.ProtoReflect().Set(fd, protoreflect.ValueOfString(key))
		send = m
	}
	return key, send, inMetadata, nil
}
