package idemgrpc

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
)

func keepAll(string) bool { return true }

// withUnknown is a StringValue that carries fields its schema lacks, as
// a message from a newer client does.
func withUnknown() *wrapperspb.StringValue {
	m := wrapperspb.String("ch_1")
	var raw []byte
	raw = protowire.AppendTag(raw, 7, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 300)
	raw = protowire.AppendTag(raw, 5, protowire.BytesType)
	raw = protowire.AppendString(raw, "later")
	m.ProtoReflect().SetUnknown(raw)
	return m
}

// An answer encodes into an idem.Response and back byte for byte: the
// reply message (its unknown fields too), the status's code, message and
// details, and the metadata kept, -bin values included.
func TestAnswerRoundTrip(t *testing.T) {
	reply, err := structpb.NewStruct(map[string]any{"id": "ch_1", "amount": 1250.0, "tags": []any{"a", "b"}, "card": map[string]any{"last4": "4242"}})
	if err != nil {
		t.Fatal(err)
	}
	declined, err := status.New(codes.FailedPrecondition, "card declined: ünïcode").WithDetails(
		&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com", Metadata: map[string]string{"b": "2", "a": "1"}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "card", Description: "expired"}}})
	if err != nil {
		t.Fatal(err)
	}
	md := metadata.MD{"x-charge": {"ch_1", "ch_2"}, "x-ledger-bin": {"\x00\xff\x01"}}
	for _, a := range []*answer{
		{reply: reply, status: status.New(codes.OK, ""), header: md, trailer: metadata.Pairs("x-balance", "10")},
		{reply: withUnknown(), status: status.New(codes.OK, "")},
		{reply: &structpb.Struct{}, status: status.New(codes.OK, "")},
		{status: declined, trailer: md},
		{status: status.New(codes.NotFound, "")},
		{status: status.New(codes.Code(42), "a code gRPC does not define")},
	} {
		resp, err := a.response(keepAll)
		if err != nil {
			t.Fatal(err)
		}
		if want := httpStatus(a.status.Code()); resp.StatusCode != want {
			t.Fatalf("%v: StatusCode %d, want %d", a.status.Code(), resp.StatusCode, want)
		}
		back, err := answerOf(resp, protoregistry.GlobalTypes)
		if err != nil {
			t.Fatalf("%v: %v", a.status.Code(), err)
		}
		again, err := back.response(keepAll)
		if err != nil {
			t.Fatal(err)
		}
		if again.StatusCode != resp.StatusCode || !reflect.DeepEqual(again.Header, resp.Header) || !bytes.Equal(again.Body, resp.Body) {
			t.Fatalf("%v: encoded %v %q, again %v %q", a.status.Code(), resp.Header, resp.Body, again.Header, again.Body)
		}
		if !proto.Equal(back.status.Proto(), a.status.Proto()) {
			t.Fatalf("status %v, want %v", back.status.Proto(), a.status.Proto())
		}
		if a.reply != nil {
			if !proto.Equal(back.reply.(proto.Message), a.reply.(proto.Message)) {
				t.Fatalf("reply %v, want %v", back.reply, a.reply)
			}
			want, _ := deterministic.Marshal(a.reply.(proto.Message))
			got, _ := deterministic.Marshal(back.reply.(proto.Message))
			if !bytes.Equal(got, want) {
				t.Fatalf("reply encodes as %x, want %x", got, want)
			}
		}
		if !reflect.DeepEqual(back.header, nonEmpty(a.header)) || !reflect.DeepEqual(back.trailer, nonEmpty(a.trailer)) {
			t.Fatalf("metadata %v %v, want %v %v", back.header, back.trailer, a.header, a.trailer)
		}
	}
}

func nonEmpty(md metadata.MD) metadata.MD {
	if md.Len() == 0 {
		return nil
	}
	return md
}

// Only the metadata keep allows is stored.
func TestAnswerKeepsAllowedMetadata(t *testing.T) {
	a := &answer{status: status.New(codes.AlreadyExists, "exists"), header: metadata.Pairs("x-keep", "1", "x-drop", "2"), trailer: metadata.Pairs("x-drop", "3")}
	resp, err := a.response(func(k string) bool { return k == "x-keep" })
	if err != nil {
		t.Fatal(err)
	}
	back, err := answerOf(resp, protoregistry.GlobalTypes)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.header, metadata.Pairs("x-keep", "1")) || back.trailer != nil {
		t.Fatalf("header %v trailer %v, want x-keep only", back.header, back.trailer)
	}
}

// A reply that is not a protocol buffer message cannot be stored.
func TestAnswerNotProto(t *testing.T) {
	for _, reply := range []any{"a string", nil} {
		if _, err := (&answer{reply: reply, status: status.New(codes.OK, "")}).response(keepAll); err == nil || !strings.Contains(err.Error(), "not a protocol buffer message") {
			t.Fatalf("%T: %v, want an error", reply, err)
		}
	}
}

// A record that is not an answer of this encoding is refused, never
// replayed as something else.
func TestAnswerCorrupt(t *testing.T) {
	good, err := (&answer{reply: wrapperspb.String("x"), status: status.New(codes.OK, "")}).response(keepAll)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := (&answer{status: status.New(codes.NotFound, "no")}).response(keepAll)
	if err != nil {
		t.Fatal(err)
	}
	with := func(r idem.Response, f func(*idem.Response)) idem.Response {
		c := idem.Response{StatusCode: r.StatusCode, Header: r.Header.Clone(), Body: bytes.Clone(r.Body)}
		f(&c)
		return c
	}
	for name, r := range map[string]idem.Response{
		"an HTTP record":     {StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`)},
		"another format":     with(good, func(r *idem.Response) { r.Header[fieldFormat] = []string{"2"} }),
		"no code":            with(good, func(r *idem.Response) { delete(r.Header, fieldCode) }),
		"a code not decimal": with(good, func(r *idem.Response) { r.Header[fieldCode] = []string{"x"} }),
		"status and code":    with(good, func(r *idem.Response) { r.StatusCode = 404 }),
		"no reply type":      with(good, func(r *idem.Response) { delete(r.Header, fieldReplyType) }),
		"an unknown type":    with(good, func(r *idem.Response) { r.Header[fieldReplyType] = []string{"no.such.Message"} }),
		"a bad reply":        with(good, func(r *idem.Response) { r.Body = []byte{0xff} }),
		"a bad status":       with(bad, func(r *idem.Response) { r.Body = []byte{0xff} }),
		"codes that differ": with(bad, func(r *idem.Response) {
			r.Body, _ = proto.Marshal(status.New(codes.AlreadyExists, "").Proto())
		}),
	} {
		if _, err := answerOf(r, protoregistry.GlobalTypes); err == nil || !strings.Contains(err.Error(), errCorrupt.Error()) {
			t.Errorf("%s: %v, want errCorrupt", name, err)
		}
	}
}
