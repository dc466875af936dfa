package idem

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A reference is checked before anything is stored: too long, not UTF-8
// or holding a control character (which would split a Location header)
// is ErrInvalidReference; MaxReference bytes are kept.
func TestCheckReference(t *testing.T) {
	for name, c := range map[string]struct {
		ref  string
		want string
	}{
		"empty":          {"", ""},
		"a path":         {"/v1/charges/ch_1", ""},
		"MaxReference":   {strings.Repeat("a", MaxReference), ""},
		"one byte more":  {strings.Repeat("a", MaxReference+1), "2049 bytes, more than 2048"},
		"not UTF-8":      {"/v1/\xff", "not valid UTF-8"},
		"a line break":   {"/v1/x\r\nSet-Cookie: a=b", "control character 0x0d at byte 5"},
		"a delete":       {"/v1/\x7f", "control character 0x7f"},
		"non-ASCII text": {"/v1/commandes/é", ""},
	} {
		err := checkReference(c.ref)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (!errors.Is(err, ErrInvalidReference) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want ErrInvalidReference saying %q", name, err, c.want)
		}
	}
}

// A reference is stored in the clear without a sealer, sealed with the
// record's additional data with one (the plaintext is not in what is
// stored), and opens back; a sealed one does not open for another
// record, nor for a Store without the sealer.
func TestSealRef(t *testing.T) {
	sealer, err := NewAESGCMSealer("k1", map[string][]byte{"k1": testKey(1)})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := New(SQLite)
	sealing, _ := New(SQLite, WithSealer(sealer))
	req := Request{Scope: "s", Key: "k", Operation: "POST /v1/charges"}
	for name, s := range map[string]*Store{"clear": plain, "sealed": sealing} {
		b, err := s.sealRef(req, "/v1/charges/ch_1")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sealed := bytes.Contains(b.([]byte), []byte("ch_1")); sealed == (s == sealing) {
			t.Errorf("%s: the plaintext in what is stored: %v", name, sealed)
		}
		if got, err := s.openRef(req, b.([]byte)); err != nil || got != "/v1/charges/ch_1" {
			t.Errorf("%s: openRef = %q, %v", name, got, err)
		}
	}
	b, _ := sealing.sealRef(req, "/v1/charges/ch_1")
	if _, err := sealing.openRef(Request{Scope: "s", Key: "other", Operation: req.Operation}, b.([]byte)); !errors.Is(err, ErrUnsealable) {
		t.Errorf("another record's reference opened: %v", err)
	}
	if _, err := plain.openRef(req, b.([]byte)); !errors.Is(err, ErrUnsealable) || !strings.Contains(err.Error(), `"k1"`) {
		t.Errorf("a Store without the sealer: %v, want ErrUnsealable naming k1", err)
	}
	if b, err := plain.sealRef(req, ""); b != nil || err != nil {
		t.Errorf("no reference is stored as %v, %v; want NULL", b, err)
	}
}
