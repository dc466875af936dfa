package jsonsel

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkFingerprintBody runs side by side what a fingerprint costs of
// a JSON body of about 1 KiB: the whole body's canonical form (idemhttp
// without a selection), two counted fields, and the body less two
// ignored ones.
func BenchmarkFingerprintBody(b *testing.B) {
	var items []string
	for i := range 12 {
		items = append(items, fmt.Sprintf(`{"sku":"sku-%04d","qty":%d,"price":"%d.99","note":"item number %d of the order"}`, i, i+1, i*10, i))
	}
	body := []byte(`{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","sent_at":"2026-12-07T03:04:05Z","amount":123456,"currency":"eur",` +
		`"customer":{"id":"cus_42","email":"a@example.com"},"items":[` + strings.Join(items, ",") + `]}`)
	fields, err := New([]string{"/amount", "/currency"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ignore, err := New(nil, []string{"/trace_id", "/sent_at"})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		run  func() ([]byte, error)
	}{
		{"whole", func() ([]byte, error) { return Canonical(body) }},
		{"fields", func() ([]byte, error) { return fields.Select(body) }},
		{"ignore", func() ([]byte, error) { return ignore.Select(body) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
