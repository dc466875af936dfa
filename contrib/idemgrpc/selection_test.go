package idemgrpc_test

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
)

// The payments service of the selection tests, described as protoc
// describes it and registered as generated code registers it:
//
//	message Meta { string trace_id = 1; string tenant = 2; }
//	message PayRequest { int64 amount = 1; string currency = 2; string sent_at = 3; Meta meta = 4; }
//	service Payments { rpc Pay(PayRequest) returns (google.protobuf.Struct); }
const methodPay = "/idemgrpc.seltest.Payments/Pay"

var payRequest = func() protoreflect.MessageDescriptor {
	str, i64, msg := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	field := func(name string, n int32, typ *descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Label: opt, Type: typ}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		return f
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("idemgrpc/seltest.proto"), Package: proto.String("idemgrpc.seltest"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/struct.proto"},
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Meta"), Field: []*descriptorpb.FieldDescriptorProto{field("trace_id", 1, str, ""), field("tenant", 2, str, "")}},
			{Name: proto.String("PayRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("amount", 1, i64, ""), field("currency", 2, str, ""), field("sent_at", 3, str, ""), field("meta", 4, msg, ".idemgrpc.seltest.Meta")}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Payments"), Method: []*descriptorpb.MethodDescriptorProto{{
			Name: proto.String("Pay"), InputType: proto.String(".idemgrpc.seltest.PayRequest"), OutputType: proto.String(".google.protobuf.Struct")}}}},
	}
	f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(f); err != nil {
		panic(err)
	}
	return f.Messages().ByName("PayRequest")
}()

// payment builds a PayRequest.
func payment(amount int64, currency, sentAt, trace, tenant string) *dynamicpb.Message {
	m := dynamicpb.NewMessage(payRequest)
	set := func(m *dynamicpb.Message, name string, v protoreflect.Value) {
		m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(name)), v)
	}
	if amount != 0 {
		set(m, "amount", protoreflect.ValueOfInt64(amount))
	}
	if currency != "" {
		set(m, "currency", protoreflect.ValueOfString(currency))
	}
	if sentAt != "" {
		set(m, "sent_at", protoreflect.ValueOfString(sentAt))
	}
	if trace != "" || tenant != "" {
		meta := dynamicpb.NewMessage(payRequest.Fields().ByName("meta").Message())
		if trace != "" {
			set(meta, "trace_id", protoreflect.ValueOfString(trace))
		}
		if tenant != "" {
			set(meta, "tenant", protoreflect.ValueOfString(tenant))
		}
		set(m, "meta", protoreflect.ValueOfMessage(meta))
	}
	return m
}

// payAPI is the Pay handler: a row per call, through the handler's
// transaction.
type payAPI struct {
	e     *env
	biz   string
	calls atomic.Int64
}

var payDesc = grpc.ServiceDesc{
	ServiceName: "idemgrpc.seltest.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Pay", Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := dynamicpb.NewMessage(payRequest)
		if err := dec(in); err != nil {
			return nil, err
		}
		handler := func(ctx context.Context, req any) (any, error) {
			return srv.(*payAPI).pay(ctx, req.(*dynamicpb.Message))
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodPay}, handler)
	}}},
	Metadata: "idemgrpc/seltest.proto",
}

func (p *payAPI) pay(ctx context.Context, in *dynamicpb.Message) (*structpb.Struct, error) {
	p.calls.Add(1)
	req, _ := idemgrpc.RequestFrom(ctx)
	amount := in.Get(payRequest.Fields().ByName("amount")).Int()
	if err := p.e.insert(ctx, p.biz, req.Key, randName("pay"), amount); err != nil {
		return nil, status.Errorf(codes.Internal, "insert: %v", err)
	}
	return structpb.NewStruct(map[string]any{"amount": float64(amount)})
}

// servePayments starts the payments service behind an interceptor of cfg.
func (e *env) servePayments(cfg idemgrpc.Config, p *payAPI) *grpc.ClientConn {
	e.t.Helper()
	if cfg.Store == nil {
		cfg.Store = e.store()
	}
	cfg.Runner, cfg.Scope, cfg.Logger = e.proc.runner(nil), byCaller, logTo(e.t)
	in, err := idemgrpc.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return dialBare(e.t, serveDesc(e.t, "127.0.0.1:0", &payDesc, p, in.Unary()).addr)
}

// pay calls Pay with key.
func pay(ctx context.Context, cc *grpc.ClientConn, key string, in proto.Message) result {
	var r result
	r.reply = &structpb.Struct{}
	err := cc.Invoke(withKey(ctx, key), methodPay, in, r.reply, grpc.Trailer(&r.trailer))
	r.status = status.Convert(err)
	r.replayed = len(r.trailer.Get(idemgrpc.MetadataReplayed)) == 1
	return r
}

// reason is the ErrorInfo reason of a status.
func reason(s *status.Status) string {
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// A method whose FieldMask counts amount and currency, and ignores
// meta.trace_id, replays a retry whose other fields changed, refuses one
// whose counted field changed or went missing, and after its selection
// changed tells a retry of an older key so; the rows are counted.
func TestFingerprintSelection(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		p := &payAPI{e: e, biz: e.business()}
		cfg := idemgrpc.Config{
			FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"amount", "currency", "meta"}}},
			FingerprintIgnore: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta.trace_id"}}},
		}
		cc := e.servePayments(cfg, p)
		ctx := t.Context()
		if r := pay(ctx, cc, "sel-1", payment(100, "eur", "12:00:00", "t-1", "acme")); r.status.Code() != codes.OK || r.replayed {
			t.Fatalf("first call: %v", r)
		}
		if r := pay(ctx, cc, "sel-1", payment(100, "eur", "12:00:07", "t-2", "acme")); r.status.Code() != codes.OK || !r.replayed {
			t.Fatalf("a retry with another sent_at and trace id: %v; want a replay", r)
		}
		for name, in := range map[string]proto.Message{
			"amount":         payment(1000, "eur", "12:00:00", "t-1", "acme"),
			"absent amount":  payment(0, "eur", "12:00:00", "t-1", "acme"),
			"counted tenant": payment(100, "eur", "12:00:00", "t-1", "other"),
			"absent meta":    payment(100, "eur", "12:00:00", "", ""),
		} {
			if r := pay(ctx, cc, "sel-1", in); r.status.Code() != codes.FailedPrecondition || reason(r.status) != idemgrpc.ReasonMismatch {
				t.Fatalf("%s changed: %v; want FAILED_PRECONDITION %s", name, r.status, idemgrpc.ReasonMismatch)
			}
		}

		// The selection changes: the older key is told so, and nothing runs.
		s := e.store()
		changed := e.servePayments(idemgrpc.Config{Store: s, FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"amount"}}}}, p)
		if r := pay(ctx, changed, "sel-2", payment(5, "eur", "1", "", "")); r.status.Code() != codes.OK {
			t.Fatalf("first call under the new selection: %v", r)
		}
		whole := e.servePayments(idemgrpc.Config{Store: s}, p)
		r := pay(ctx, whole, "sel-2", payment(5, "eur", "1", "", ""))
		if r.status.Code() != codes.FailedPrecondition || reason(r.status) != idemgrpc.ReasonFingerprintChanged || !strings.Contains(r.status.Message(), "changed which fields") {
			t.Fatalf("a retry after the selection changed: %v (%s); want FAILED_PRECONDITION %s", r.status, reason(r.status), idemgrpc.ReasonFingerprintChanged)
		}
		if n := p.calls.Load(); n != 2 || e.rows(p.biz, "sel-1") != 1 || e.rows(p.biz, "sel-2") != 1 {
			t.Fatalf("the handler ran %d times, rows %d and %d; want 2, 1 and 1", n, e.rows(p.biz, "sel-1"), e.rows(p.biz, "sel-2"))
		}
	})
}

// A path that is not one, or does not resolve in the registered request
// message, is an error of New.
func TestFingerprintSelectionRefused(t *testing.T) {
	db, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	good := idemgrpc.Config{Store: s, DB: db, Scope: idemgrpc.SingleTenant,
		FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"amount", "meta.tenant"}}},
		FingerprintIgnore: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta.trace_id"}}, "/other.v1.Svc/Unregistered": {Paths: []string{"x"}}}}
	if _, err := idemgrpc.New(good); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []idemgrpc.Config{
		{FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"amount", "colour"}}}},
		{FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"currency.code"}}}},
		{FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"amount", "amount"}}}},
		{FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta", "meta.tenant"}}}},
		{FingerprintFields: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta.tenant"}}}, FingerprintIgnore: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta"}}}},
		{FingerprintIgnore: map[string]*fieldmaskpb.FieldMask{methodPay: {Paths: []string{"meta..x"}}}},
		{FingerprintIgnore: map[string]*fieldmaskpb.FieldMask{"Pay": {Paths: []string{"amount"}}}},
	} {
		cfg.Store, cfg.DB, cfg.Scope = s, db, idemgrpc.SingleTenant
		if _, err := idemgrpc.New(cfg); err == nil || !strings.Contains(err.Error(), "Fingerprint") {
			t.Errorf("New of %v %v: %v, want an error about the selection", cfg.FingerprintFields, cfg.FingerprintIgnore, err)
		}
	}
}
