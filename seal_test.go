package idem

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// The AES-GCM sealer opens what it sealed, under the same additional data
// only; a new current key seals while the old ones still open; a key it
// does not have, a changed byte or another record's additional data is
// an error that names the key.
func TestAESGCMSealer(t *testing.T) {
	old, err := NewAESGCMSealer("k1", map[string][]byte{"k1": testKey(1)})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := NewAESGCMSealer("k2", map[string][]byte{"k1": testKey(1), "k2": testKey(2)})
	if err != nil {
		t.Fatal(err)
	}
	ad := []byte("table/scope/key/op")
	sealed, err := old.Seal([]byte("card 4242"), ad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("4242")) {
		t.Fatal("the ciphertext holds the plaintext")
	}
	again, _ := old.Seal([]byte("card 4242"), ad)
	if bytes.Equal(sealed, again) {
		t.Fatal("two seals of one plaintext are the same bytes")
	}
	for name, s := range map[string]Sealer{"the sealer that sealed": old, "after rotation": rotated} {
		if got, err := s.Open(sealed, ad); err != nil || string(got) != "card 4242" {
			t.Errorf("%s: Open = %q, %v", name, got, err)
		}
	}
	if id, _, _ := sealedKeyID(sealed); id != "k1" {
		t.Errorf("key ID %q, want k1", id)
	}
	if s2, _ := rotated.Seal([]byte("x"), ad); !strings.HasPrefix(string(s2[2:]), "k2") {
		t.Errorf("the rotated sealer seals with %q, want k2", s2[2:4])
	}
	newOnly, _ := NewAESGCMSealer("k2", map[string][]byte{"k2": testKey(2)})
	tampered := append([]byte(nil), sealed...)
	tampered[len(tampered)-1] ^= 1
	for name, c := range map[string]struct {
		s      Sealer
		b, ad  []byte
		wanted string
	}{
		"unknown key":  {newOnly, sealed, ad, `key "k1", which the sealer does not have`},
		"tampered":     {old, tampered, ad, `key "k1", but it does not open`},
		"other record": {old, sealed, []byte("table/scope/other/op"), `key "k1", but it does not open`},
		"not sealed":   {old, []byte("plain body"), ad, "malformed"},
	} {
		if _, err := c.s.Open(c.b, c.ad); err == nil || !strings.Contains(err.Error(), c.wanted) {
			t.Errorf("%s: Open error %v, want one saying %q", name, err, c.wanted)
		}
	}
}

func TestNewAESGCMSealerRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		current string
		keys    map[string][]byte
		want    string
	}{
		"no current":  {"k9", map[string][]byte{"k1": testKey(1)}, `current key "k9" is not among the keys ("k1")`},
		"short key":   {"k1", map[string][]byte{"k1": make([]byte, 16)}, "16 bytes; AES-256 takes 32"},
		"bad key ID":  {"k 1", map[string][]byte{"k 1": testKey(1)}, "not visible ASCII"},
		"long key ID": {strings.Repeat("k", 65), map[string][]byte{strings.Repeat("k", 65): testKey(1)}, "1 to 64 bytes"},
	} {
		if _, err := NewAESGCMSealer(c.current, c.keys); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// A Store seals a response's header and body together under the record's
// additional data, stores the key's name beside it, and opens it again;
// in the clear without a sealer; a sealed record opened by a Store
// without the key is an Error naming the key.
func TestStoreSealsResponses(t *testing.T) {
	sealer, _ := NewAESGCMSealer("k1", map[string][]byte{"k1": testKey(1)})
	sealed, _ := New(Postgres, WithSealer(sealer))
	plain, _ := New(Postgres)
	req := Request{Scope: "s", Key: "k", Operation: "POST /v1/charges"}
	resp := Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"last4":"4242"}`)}
	out, err := sealed.seal(req, resp)
	body := out.body
	if err != nil || out.header != nil || out.keyID != "k1" || bytes.Contains(body, []byte("4242")) {
		t.Fatalf("seal: header %q, key %v, body %q, %v", out.header, out.keyID, body, err)
	}
	h, b, err := sealed.open(req, "k1", nil, body)
	if err != nil || string(b) != string(resp.Body) {
		t.Fatalf("open: %q, %v", b, err)
	}
	if got, err := decodeHeader(h); err != nil || got.Get("Content-Type") != "application/json" {
		t.Fatalf("open: header %q, %v", got, err)
	}
	if _, _, err := sealed.open(Request{Scope: "s", Key: "other", Operation: req.Operation}, "k1", nil, body); !errors.Is(err, ErrUnsealable) {
		t.Errorf("opened for another key: %v", err)
	}
	_, _, err = plain.open(req, "k1", nil, body)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Error(), `sealed with key "k1"`) || e.Hint == "" {
		t.Errorf("a Store without the sealer: %v", err)
	}
	if u, ok := errors.AsType[*UnsealableError](err); !ok || u.KeyID != "k1" || !errors.Is(err, ErrUnsealable) {
		t.Errorf("a Store without the sealer: %v; want an *UnsealableError naming k1", err)
	}
	out, _ = sealed.seal(req, Response{StatusCode: 204})
	if h, b, err := sealed.open(req, "k1", nil, out.body); err != nil || h != nil || len(b) != 0 {
		t.Errorf("a response without a header or a body opens to %q, %q, %v", h, b, err)
	}
	out, _ = plain.seal(req, resp)
	if out.keyID != nil || string(out.body) != string(resp.Body) || out.header == nil {
		t.Errorf("a Store without a sealer sealed: %q %v", out.body, out.keyID)
	}
}
