package idemgrpc

import (
	"testing"

	"google.golang.org/protobuf/types/known/apipb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// A selection of ignored fields alone counts the rest of the message; one
// of counted fields counts them alone; and neither changes the request.
func TestSelectionEncode(t *testing.T) {
	const method = "/google.protobuf.Api/Method"
	ignore, err := newSelection(method, nil, &fieldmaskpb.FieldMask{Paths: []string{"request_type_url"}})
	if err != nil {
		t.Fatal(err)
	}
	fields, err := newSelection(method, &fieldmaskpb.FieldMask{Paths: []string{"name", "syntax"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ignore.version == fields.version {
		t.Fatal("two selections share a version")
	}
	a := &apipb.Method{Name: "Charge", RequestTypeUrl: "type.googleapis.com/a", ResponseTypeUrl: "r"}
	b := &apipb.Method{Name: "Charge", RequestTypeUrl: "type.googleapis.com/b", ResponseTypeUrl: "r"}
	c := &apipb.Method{Name: "Charge", RequestTypeUrl: "type.googleapis.com/a", ResponseTypeUrl: "other"}
	enc := func(s *selection, m *apipb.Method) string { return string(s.encode(m.ProtoReflect())) }
	if enc(ignore, a) != enc(ignore, b) {
		t.Error("an ignored field changed what counts")
	}
	if enc(ignore, a) == enc(ignore, c) {
		t.Error("a field that is not ignored did not count")
	}
	if enc(fields, a) != enc(fields, c) || enc(fields, a) == enc(fields, &apipb.Method{Name: "Refund"}) {
		t.Error("the counted fields do not decide alone")
	}
	if enc(fields, &apipb.Method{}) == enc(fields, &apipb.Method{Name: "x"}) {
		t.Error("an absent counted field counts as a present one")
	}
	if b.RequestTypeUrl != "type.googleapis.com/b" {
		t.Error("encode cleared a field of the request itself")
	}
}
