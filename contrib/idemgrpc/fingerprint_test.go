package idemgrpc

import (
	"bytes"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func fp(t *testing.T, method string, m proto.Message) string {
	t.Helper()
	return fingerprint(method, m.ProtoReflect())
}

func mustStruct(t *testing.T, v map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// decoded is a Struct decoded from its entries' encodings in the order
// given: how a client that marshals a map in another order sends it.
func decoded(t *testing.T, entries ...map[string]any) *structpb.Struct {
	t.Helper()
	var wire []byte
	for _, e := range entries {
		b, err := proto.Marshal(mustStruct(t, e))
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, b...) // concatenated messages merge
	}
	s := &structpb.Struct{}
	if err := proto.Unmarshal(wire, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// unknown is a StringValue with unknown varint fields (number, value) in
// the order given.
func unknown(fields ...uint64) *wrapperspb.StringValue {
	m := wrapperspb.String("x")
	var raw []byte
	for i := 0; i < len(fields); i += 2 {
		raw = protowire.AppendTag(raw, protowire.Number(fields[i]), protowire.VarintType)
		raw = protowire.AppendVarint(raw, fields[i+1])
	}
	m.ProtoReflect().SetUnknown(raw)
	return m
}

// The fingerprint is the same for the same request, however it was
// encoded on the wire, and differs for any other request.
func TestFingerprint(t *testing.T) {
	const method = "/payments.v1.Payments/CreateCharge"
	a := map[string]any{"amount": 100.0}
	b := map[string]any{"currency": "eur", "meta": map[string]any{"x": "1", "y": []any{"a", "bc"}}}
	same := [][2]proto.Message{
		{decoded(t, a, b), decoded(t, b, a)},                  // map entries in another order
		{unknown(5, 1, 7, 2), unknown(7, 2, 5, 1)},            // unknown fields in another order
		{wrapperspb.Int32(-5), wrapperspb.Int64(-5)},          // a field widened from int32 to int64
		{wrapperspb.String(""), &wrapperspb.StringValue{}},    // proto3's default is no value
		{mustStruct(t, map[string]any{}), &structpb.Struct{}}, // an empty map is no map
	}
	for _, p := range same {
		if x, y := fp(t, method, p[0]), fp(t, method, p[1]); x != y {
			t.Errorf("%v and %v: fingerprints %s and %s, want equal", p[0], p[1], x, y)
		}
	}
	differ := [][2]proto.Message{
		{mustStruct(t, map[string]any{"amount": 100.0}), mustStruct(t, map[string]any{"amount": 1000.0})},
		{mustStruct(t, map[string]any{"amount": 0.0}), mustStruct(t, map[string]any{"amount": math.Copysign(0, -1)})},
		{mustStruct(t, map[string]any{"amount": "1"}), mustStruct(t, map[string]any{"amount": 1.0})},
		{mustStruct(t, map[string]any{"l": []any{"a", "bc"}}), mustStruct(t, map[string]any{"l": []any{"ab", "c"}})},
		{mustStruct(t, map[string]any{"l": []any{"a", "b"}}), mustStruct(t, map[string]any{"l": []any{"b", "a"}})},
		{mustStruct(t, map[string]any{"ab": "c"}), mustStruct(t, map[string]any{"a": "bc"})},
		{unknown(5, 1, 5, 2), unknown(5, 2, 5, 1)}, // a repeated unknown field's order counts
		{unknown(5, 1), wrapperspb.String("x")},
		{wrapperspb.Bool(false), wrapperspb.Bool(true)},
	}
	for _, p := range differ {
		if x, y := fp(t, method, p[0]), fp(t, method, p[1]); x == y {
			t.Errorf("%v and %v: one fingerprint %s, want two", p[0], p[1], x)
		}
	}
	m := mustStruct(t, a)
	if fp(t, method, m) == fp(t, "/payments.v1.Payments/CreateRefund", m) {
		t.Error("two methods, one fingerprint")
	}
}

// The canonical form is fixed: a change to it changes fingerprints that
// are stored, so it must come with a new fingerprintVersion (and this
// value).
func TestFingerprintGolden(t *testing.T) {
	m := mustStruct(t, map[string]any{"amount": 1250.0, "currency": "eur", "ok": true, "tags": []any{"a", nil}, "card": map[string]any{"last4": "4242"}})
	const want = "90d1a456250876b52fdeae92a9526bcbe4bcef32c72bb3a9b13ea11661c7614e"
	if got := fp(t, "/payments.v1.Payments/CreateCharge", m); got != want {
		t.Fatalf("fingerprint %s, want %s", got, want)
	}
}

// Every scalar kind has a form of its own width, so that a field's value
// cannot run into the next field's number.
func TestCanonicalScalars(t *testing.T) {
	for _, c := range []struct {
		m    proto.Message
		want []byte
	}{
		{wrapperspb.Bool(true), []byte{1, 1, 0, 0}},
		{wrapperspb.Int32(-1), append(append([]byte{1}, bytes.Repeat([]byte{0xff}, 8)...), 0, 0)},
		{wrapperspb.UInt32(1), []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}},
		{wrapperspb.Float(1), []byte{1, 0x3f, 0x80, 0, 0, 0, 0}},
		{wrapperspb.Double(1), []byte{1, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{wrapperspb.String("ab"), []byte{1, 2, 'a', 'b', 0, 0}},
		{wrapperspb.Bytes([]byte{0}), []byte{1, 1, 0, 0, 0}},
	} {
		if got := canonical(nil, c.m.ProtoReflect()); !bytes.Equal(got, c.want) {
			t.Errorf("%v: %x, want %x", c.m, got, c.want)
		}
	}
}
