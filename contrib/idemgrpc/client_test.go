package idemgrpc_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/contrib/idemgrpc"
)

// keysSeen is a server of the test service, without idem, that records
// the key of every attempt that reaches it and answers the n-th with
// fail(n) (1-based).
type keysSeen struct {
	mu   sync.Mutex
	keys []string // "" for an attempt without a key
	fail func(n int) error
}

func (k *keysSeen) record(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey)
	if len(key) != 1 {
		key = []string{""}
	}
	k.keys = append(k.keys, key[0])
	if k.fail != nil {
		return k.fail(len(k.keys))
	}
	return nil
}

func (k *keysSeen) reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = nil
}

func (k *keysSeen) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

func (k *keysSeen) Charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	return in, k.record(ctx)
}

func (k *keysSeen) Refund(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	return in, k.record(ctx)
}

func (k *keysSeen) Get(ctx context.Context, _ *wrapperspb.StringValue) (*structpb.Struct, error) {
	return &structpb.Struct{}, k.record(ctx)
}

// failFirst answers the first n attempts with code.
func failFirst(n int, code codes.Code) func(int) error {
	return func(i int) error {
		if i <= n {
			return status.Error(code, "not yet")
		}
		return nil
	}
}

// checkOneKey asserts that the server saw n attempts, all with key, a
// key of the interceptor's.
func checkOneKey(t *testing.T, seen []string, n int, key string) {
	t.Helper()
	if len(seen) != n || key == "" {
		t.Fatalf("the server saw keys %q, the caller %q; want %d attempts with one key", seen, key, n)
	}
	for _, k := range seen {
		if k != key {
			t.Fatalf("the server saw keys %q; want %q on every attempt", seen, key)
		}
	}
}

// gRPC's own retries (a retry policy of the service config) carry the
// key the interceptor chose, and UseKey tells the caller which it was.
func TestClientKeyAcrossGRPCRetries(t *testing.T) {
	t.Parallel()
	svc := &keysSeen{fail: failFirst(2, codes.Unavailable)}
	srv := serve(t, "127.0.0.1:0", svc)
	cc := dial(t, srv.addr, grpc.WithDefaultServiceConfig(retryPolicy))
	var key string
	if r := call(t.Context(), cc, methodCharge, 1, idemgrpc.UseKey(&key)); r.status.Code() != codes.OK {
		t.Fatal(r)
	}
	checkOneKey(t, svc.seen(), 3, key)
}

// An application that retries a call itself keeps its key with UseKey,
// or in the context's metadata.
func TestClientKeyAcrossApplicationRetries(t *testing.T) {
	t.Parallel()
	svc := &keysSeen{fail: failFirst(2, codes.Aborted)} // not in the retry policy
	srv := serve(t, "127.0.0.1:0", svc)
	cc := dial(t, srv.addr, grpc.WithDefaultServiceConfig(retryPolicy))
	var key string
	for attempt := 1; ; attempt++ {
		r := call(t.Context(), cc, methodCharge, 1, idemgrpc.UseKey(&key))
		if r.status.Code() == codes.OK {
			break
		}
		if r.status.Code() != codes.Aborted || attempt == 3 {
			t.Fatalf("attempt %d: %v", attempt, r)
		}
	}
	checkOneKey(t, svc.seen(), 3, key)

	svc.reset()
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "order-7")
	var used string
	for range 2 {
		call(ctx, cc, methodCharge, 1, idemgrpc.UseKey(&used))
	}
	checkOneKey(t, svc.seen(), 2, "order-7")
	if used != "order-7" {
		t.Fatalf("UseKey says %q, the context carried order-7", used)
	}
}

// Each call without a key gets a new one; one with two keys that differ
// fails before it is sent; a method without side effects is called
// without a key.
func TestClientKeys(t *testing.T) {
	t.Parallel()
	svc := &keysSeen{}
	srv := serve(t, "127.0.0.1:0", svc)
	cc := dial(t, srv.addr)
	call(t.Context(), cc, methodCharge, 1)
	call(t.Context(), cc, methodCharge, 1)
	if seen := svc.seen(); len(seen) != 2 || seen[0] == seen[1] || seen[0] == "" {
		t.Fatalf("two calls sent keys %q; want two new keys", seen)
	}

	key := "b"
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "a")
	if r := call(ctx, cc, methodCharge, 1, idemgrpc.UseKey(&key)); r.status.Code() != codes.InvalidArgument {
		t.Fatalf("two keys: %v, want INVALID_ARGUMENT", r)
	}
	two := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "b")
	if r := call(two, cc, methodCharge, 1); r.status.Code() != codes.InvalidArgument {
		t.Fatalf("two metadata values: %v, want INVALID_ARGUMENT", r)
	}
	if n := len(svc.seen()); n != 2 {
		t.Fatalf("the server saw %d calls; the refused ones must not be sent", n)
	}

	svc.reset()
	plain := dialBare(t, srv.addr, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithNoSideEffects(methodGet))))
	if err := plain.Invoke(t.Context(), methodGet, wrapperspb.String("ch_1"), &structpb.Struct{}); err != nil {
		t.Fatal(err)
	}
	if seen := svc.seen(); len(seen) != 1 || seen[0] != "" {
		t.Fatalf("Get sent keys %q; want none", seen)
	}
}
