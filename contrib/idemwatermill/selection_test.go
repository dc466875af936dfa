package idemwatermill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// A consumer that counts selected payload fields and a metadata field
// applies a redelivery whose volatile fields changed once, refuses one
// whose counted field changed or went missing, refuses a payload that is
// not JSON as poison, records the fingerprint FingerprintOf computes,
// and after its selection changed tells a redelivery of a message
// recorded before so (poison too). The handler's runs are counted.
func TestPayloadFields(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		store := e.store()
		counted := func(cfg *idemwatermill.Config) {
			cfg.Scope = "direct"
			cfg.Fingerprint = []string{"tenant"}
			cfg.PayloadFields = []string{"/order_id", "/amount"}
		}
		var runs atomic.Int64
		handler := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }
		h := e.middleware(store, idemserve.ModeTransaction, counted)(handler)
		msg := func(id, payload, tenant string) *message.Message {
			m := message.NewMessage(id, []byte(payload))
			m.Metadata.Set("tenant", tenant)
			m.Metadata.Set("trace", payload)
			return m
		}
		for _, c := range []struct {
			m    *message.Message
			want error
		}{
			{msg("p-1", `{"order_id":"o-1","amount":100,"sent_at":"12:00"}`, "acme"), nil},
			{msg("p-1", `{"sent_at":"12:05","amount":100,"order_id":"o-1","attempt":2}`, "acme"), nil},
			{msg("p-1", `{"order_id":"o-1","amount":101,"sent_at":"12:00"}`, "acme"), idem.ErrMismatch},
			{msg("p-1", `{"order_id":"o-1","sent_at":"12:00"}`, "acme"), idem.ErrMismatch},
			{msg("p-1", `{"order_id":"o-1","amount":100}`, "other"), idem.ErrMismatch},
			{msg("p-2", `order_id=o-2`, "acme"), idem.ErrInvalidRequest},
			{msg("p-3", `{"order_id":"o-3","ORDER_ID":"o-4","amount":1}`, "acme"), idem.ErrInvalidRequest},
		} {
			_, err := h(c.m)
			if c.want == nil && err != nil || c.want != nil && (!errors.Is(err, c.want) || !idemwatermill.IsPoison(err)) {
				t.Errorf("message %s %s: %v, want %v", c.m.UUID, c.m.Payload, err, c.want)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}

		var cfg idemwatermill.Config
		counted(&cfg)
		first := msg("p-1", `{"order_id":"o-1","amount":100,"sent_at":"12:00"}`, "acme")
		want, err := idemwatermill.FingerprintOf(cfg, first)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := store.Inspect(context.Background(), e.db, "direct", "p-1")
		if err != nil || rec == nil || rec.Fingerprint != want {
			t.Fatalf("the record %+v (%v); want its fingerprint to be FingerprintOf's, %s", rec, err, want)
		}

		changed := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
			counted(cfg)
			cfg.PayloadFields = []string{"/order_id"}
		})(handler)
		if _, err := changed(first); !errors.Is(err, idem.ErrFingerprintChanged) || !idemwatermill.IsPoison(err) {
			t.Fatalf("a redelivery after the selection changed: %v, want ErrFingerprintChanged, poison", err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
	})
}

// Without a payload selection the fingerprint is the one the
// documentation gives: idem.Fingerprint of the payload, then each named
// field's name and value, "" for an absent one.
func TestFingerprintOf(t *testing.T) {
	m := message.NewMessage("x", []byte(`{"b":1, "a":2}`))
	m.Metadata.Set("tenant", "acme")
	got, err := idemwatermill.FingerprintOf(idemwatermill.Config{Fingerprint: []string{"tenant", "version"}}, m)
	want := idem.Fingerprint(m.Payload, []byte("tenant"), []byte("acme"), []byte("version"), []byte(""))
	if err != nil || got != want {
		t.Fatalf("FingerprintOf = %s, %v; want %s", got, err, want)
	}
	sel := idemwatermill.Config{Fingerprint: []string{"tenant"}, PayloadIgnore: []string{"/b"}}
	got, err = idemwatermill.FingerprintOf(sel, m)
	if err != nil || idem.FingerprintVersion(got) == "" || got[len(got)-64:] != idem.Fingerprint([]byte(`{"a":2}`), []byte("tenant"), []byte("acme")) {
		t.Fatalf("FingerprintOf with PayloadIgnore = %s, %v; want a versioned fingerprint of {\"a\":2} and the tenant", got, err)
	}
	if _, err := idemwatermill.FingerprintOf(idemwatermill.Config{PayloadFields: []string{"a"}}, m); err == nil {
		t.Fatal("a pointer without its slash was accepted")
	}
}
