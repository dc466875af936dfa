package idemgrpc_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemkit/idem/contrib/idemgrpc"
)

// payments is an AIP-style API, as protoc would register it from
//
//	service Payments {
//	  rpc CreateCharge(CreateChargeRequest) returns (Charge);
//	  rpc GetCharge(GetChargeRequest) returns (Charge) {
//	    option idempotency_level = NO_SIDE_EFFECTS;
//	  }
//	}
//	message CreateChargeRequest { string request_id = 1; int64 amount = 2; }
//	message GetChargeRequest { string name = 1; }
//	message Charge { string name = 1; int64 amount = 2; string request_id = 3; }
//
// built here from its descriptor, so that the tests need no protoc.
var payments = func() protoreflect.FileDescriptor {
	field := func(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(name)}
	}
	str, i64 := descriptorpb.FieldDescriptorProto_TYPE_STRING, descriptorpb.FieldDescriptorProto_TYPE_INT64
	fdp := &descriptorpb.FileDescriptorProto{
		Name: proto.String("idemgrpc/test/payments.proto"), Package: proto.String("idemgrpc.test.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("CreateChargeRequest"), Field: []*descriptorpb.FieldDescriptorProto{field("request_id", 1, str), field("amount", 2, i64)}},
			{Name: proto.String("GetChargeRequest"), Field: []*descriptorpb.FieldDescriptorProto{field("name", 1, str)}},
			{Name: proto.String("Charge"), Field: []*descriptorpb.FieldDescriptorProto{field("name", 1, str), field("amount", 2, i64), field("request_id", 3, str)}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Payments"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("CreateCharge"), InputType: proto.String(".idemgrpc.test.v1.CreateChargeRequest"), OutputType: proto.String(".idemgrpc.test.v1.Charge")},
			{Name: proto.String("GetCharge"), InputType: proto.String(".idemgrpc.test.v1.GetChargeRequest"), OutputType: proto.String(".idemgrpc.test.v1.Charge"),
				Options: &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum()}},
		}}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
	for i := range fd.Messages().Len() {
		if err := protoregistry.GlobalTypes.RegisterMessage(dynamicpb.NewMessageType(fd.Messages().Get(i))); err != nil {
			panic(err)
		}
	}
	return fd
}()

const (
	methodCreateCharge = "/idemgrpc.test.v1.Payments/CreateCharge"
	methodGetCharge    = "/idemgrpc.test.v1.Payments/GetCharge"
)

// msg is a new message of payments named name, with the fields set.
func msg(name string, fields map[string]any) *dynamicpb.Message {
	m := dynamicpb.NewMessage(payments.Messages().ByName(protoreflect.Name(name)))
	for k, v := range fields {
		m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(k)), protoreflect.ValueOf(v))
	}
	return m
}

func get(m proto.Message, field string) protoreflect.Value {
	return m.ProtoReflect().Get(m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(field)))
}

// paymentsAPI implements Payments: CreateCharge writes one row through
// TxFrom, keyed by the idempotency key idem ran it with.
type paymentsAPI struct {
	e    *env
	biz  string
	seen chan metadata.MD // the metadata of each GetCharge
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "idemgrpc.test.v1.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		dynamicMethod("CreateCharge", "CreateChargeRequest", (*paymentsAPI).CreateCharge),
		dynamicMethod("GetCharge", "GetChargeRequest", (*paymentsAPI).GetCharge),
	},
	Metadata: "idemgrpc/test/payments.proto",
}

func dynamicMethod(name, in string, call func(*paymentsAPI, context.Context, *dynamicpb.Message) (*dynamicpb.Message, error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		req := msg(in, nil)
		if err := dec(req); err != nil {
			return nil, err
		}
		return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/idemgrpc.test.v1.Payments/" + name},
			func(ctx context.Context, req any) (any, error) {
				return call(srv.(*paymentsAPI), ctx, req.(*dynamicpb.Message))
			})
	}}
}

func (a *paymentsAPI) CreateCharge(ctx context.Context, in *dynamicpb.Message) (*dynamicpb.Message, error) {
	req, _ := idemgrpc.RequestFrom(ctx)
	name := randName("charges/ch")
	if err := a.e.insert(ctx, a.biz, req.Key, name, get(in, "amount").Int()); err != nil {
		return nil, status.Errorf(codes.Internal, "insert: %v", err)
	}
	return msg("Charge", map[string]any{"name": name, "amount": get(in, "amount").Int(), "request_id": get(in, "request_id").String()}), nil
}

func (a *paymentsAPI) GetCharge(ctx context.Context, in *dynamicpb.Message) (*dynamicpb.Message, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a.e.hasTx(ctx) {
		md = metadata.Join(md, metadata.Pairs("had-tx", "true"))
	}
	a.seen <- md
	return msg("Charge", map[string]any{"name": get(in, "name").String()}), nil
}

// An AIP-155 API takes its key from request_id (Config.KeyField), and
// the client interceptor fills request_id when it is empty (AIP-4235),
// on a copy, with the key it keeps for retries. A method declared
// NO_SIDE_EFFECTS passes through both, with no key and no transaction.
func TestAIP155(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := &paymentsAPI{e: e, biz: e.business(), seen: make(chan metadata.MD, 1)}
		in := mustNew(t, idemgrpc.Config{Store: e.store(), Runner: e.proc.runner(nil), Scope: idemgrpc.SingleTenant, KeyField: "request_id", Required: true, Logger: logTo(t)})
		lis := serveDesc(t, "127.0.0.1:0", &paymentsDesc, a, in.Unary())
		filling := dialBare(t, lis.addr, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithKeyField("request_id"))))
		bare := dialBare(t, lis.addr)
		ctx := t.Context()

		req := msg("CreateChargeRequest", map[string]any{"amount": int64(500)})
		var key string
		var replies []*dynamicpb.Message
		var trailers []metadata.MD
		for range 2 {
			reply, tr := msg("Charge", nil), metadata.MD{}
			if err := filling.Invoke(ctx, methodCreateCharge, req, reply, idemgrpc.UseKey(&key), grpc.Trailer(&tr)); err != nil {
				t.Fatal(err)
			}
			replies, trailers = append(replies, reply), append(trailers, tr)
		}
		if get(req, "request_id").String() != "" {
			t.Fatalf("the caller's request was changed: request_id %q", get(req, "request_id"))
		}
		if got := get(replies[0], "request_id").String(); got != key || key == "" {
			t.Fatalf("the server saw request_id %q, the caller's key is %q", got, key)
		}
		if !proto.Equal(replies[0], replies[1]) || len(trailers[1].Get(idemgrpc.MetadataReplayed)) != 1 {
			t.Fatalf("replies %v then %v (trailer %v); want the second a replay", replies[0], replies[1], trailers[1])
		}
		if got := e.rows(a.biz, key); got != 1 {
			t.Fatalf("%d rows for key %s, want 1", got, key)
		}

		// A request_id set by the caller is the key, with no metadata.
		set := msg("CreateChargeRequest", map[string]any{"request_id": "8e03978e-40d5-43e8-bc93-6894a57f9324", "amount": int64(7)})
		for range 2 {
			if err := bare.Invoke(ctx, methodCreateCharge, set, msg("Charge", nil)); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.rows(a.biz, "8e03978e-40d5-43e8-bc93-6894a57f9324"); got != 1 {
			t.Fatalf("%d rows for the request_id, want 1", got)
		}

		for name, c := range map[string]struct {
			ctx context.Context
			req proto.Message
		}{
			"field and metadata differ": {metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "other"), set},
			"not visible ASCII":         {ctx, msg("CreateChargeRequest", map[string]any{"request_id": "caf\u00e9"})},
		} {
			t.Run(name, func(t *testing.T) {
				err := bare.Invoke(c.ctx, methodCreateCharge, c.req, msg("Charge", nil))
				checkStatus(t, result{status: status.Convert(err)}, codes.InvalidArgument, idemgrpc.ReasonInvalidKey)
			})
		}
		err := bare.Invoke(ctx, methodCreateCharge, msg("CreateChargeRequest", nil), msg("Charge", nil))
		checkStatus(t, result{status: status.Convert(err)}, codes.InvalidArgument, idemgrpc.ReasonMissingKey)

		if err := filling.Invoke(ctx, methodGetCharge, msg("GetChargeRequest", map[string]any{"name": "charges/1"}), msg("Charge", nil)); err != nil {
			t.Fatal(err)
		}
		if md := <-a.seen; len(md.Get(idemgrpc.MetadataKey)) != 0 || len(md.Get("had-tx")) != 0 {
			t.Fatalf("GetCharge ran with %v; want no key and no transaction", md)
		}
	})
}
