package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// invoice is a typed call's result: fields of many kinds, nested, with
// text that the stored encoding must carry byte for byte.
type invoice struct {
	ID       int64             `json:"id"`
	Amount   float64           `json:"amount"`
	Big      uint64            `json:"big"`
	Lines    []string          `json:"lines"`
	Meta     map[string]string `json:"meta"`
	Paid     *time.Time        `json:"paid"`
	Note     string            `json:"note"`
	Declined bool              `json:"declined"`
}

// call runs idem.Call (idem.CallOn, through the Runner's transaction,
// where the target's DB is not SQL's) in tx.
func call[T any](s *store, tx txn, req idem.Request, fn func(ctx context.Context) (T, error), opts ...idem.CallOption) (T, bool, error) {
	if !s.onSQL {
		return idem.CallOn(ctx, s.Store, txOf(tx), req, fn, opts...)
	}
	return idem.Call(ctx, s.Store, sqlOf(tx), req, fn, opts...)
}

// callTx runs call in a transaction of its own through runTx, which
// retries, and commits it.
func callTx[T any](e *env, s *store, req idem.Request, fn func(tx handle) func(ctx context.Context) (T, error), opts ...idem.CallOption) (T, bool, error) {
	var (
		v        T
		replayed bool
	)
	err := runTx(ctx, e.db, nil, func(tx txn) error {
		var err error
		v, replayed, err = call(s, tx, req, fn(tx), opts...)
		return err
	})
	return v, replayed, err
}

// A typed call runs once per key and its replay returns a value equal to
// the one the first run returned, through the default JSON codec and a
// codec of the caller's; it meets another request, a live claim, a key
// past its retention and a sealed store as Do does; an error of fn
// stores nothing; a key stored by Do does not replay into a type.
func testTypedCall(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store(idem.WithRetention(time.Hour), idem.WithKeyMemory(24*time.Hour))
		o := e.op()
		paid := time.Date(2026, 12, 7, 3, 4, 5, 123456789, time.UTC)
		want := invoice{ID: 42, Amount: 19.99, Big: math.MaxUint64, Lines: []string{"caf\u00e9", `quote " and \ slash`, "\u2028"},
			Meta: map[string]string{"b": "2", "a": "1"}, Paid: &paid, Note: strings.Repeat("x", 70000)}
		run := func(tx handle) func(ctx context.Context) (invoice, error) {
			return func(ctx context.Context) (invoice, error) {
				n := o.calls.Add(1)
				return want, e.insertRow(tx, o.biz, "typed", fmt.Sprintf("run-%d", n))
			}
		}
		req := charge("typed-1", "100")
		first, replayed, err := callTx(e, s, req, run)
		must(t, err)
		if replayed || !reflect.DeepEqual(first, want) {
			t.Fatalf("first call: replayed=%v, value equal to fn's: %v", replayed, reflect.DeepEqual(first, want))
		}
		again, replayed, err := callTx(e, s, req, run)
		must(t, err)
		if !replayed || !reflect.DeepEqual(again, want) {
			t.Fatalf("replay: replayed=%v, equal: %v\n got %+v\nwant %+v", replayed, reflect.DeepEqual(again, want), again.Meta, want.Meta)
		}
		if n, rows := o.calls.Load(), e.count(o.biz, "typed"); n != 1 || rows != 1 {
			t.Fatalf("fn ran %d times, %d business rows; want 1, 1", n, rows)
		}

		// A scalar type and a codec of the caller's.
		n := 0
		count := func(handle) func(context.Context) (int, error) {
			return func(context.Context) (int, error) { n++; return 7, nil }
		}
		for range 2 {
			v, _, err := callTx(e, s, charge("typed-codec", "1"), count, idem.WithCodec(upperCodec{}))
			must(t, err)
			if v != 7 {
				t.Fatalf("typed call with a codec of its own: %d, want 7", v)
			}
		}
		if n != 1 {
			t.Fatalf("fn of the codec's call ran %d times, want 1", n)
		}
		if _, _, err := callTx(e, s, charge("typed-codec", "1"), count); err == nil || errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("the same key replayed with the JSON codec: %v, want an error saying the codec differs", err)
		}

		// An empty Operation is refused before any statement.
		unbound := charge("typed-unbound", "1")
		unbound.Operation = ""
		if _, _, err := callTx(e, s, unbound, run); !errors.Is(err, idem.ErrInvalidRequest) || e.records(s, unbound.Key) != 0 {
			t.Fatalf("an empty Operation: %v, want ErrInvalidRequest and no record", err)
		}
		// Another request with the key.
		if _, _, err := callTx(e, s, charge(req.Key, "999"), run); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("another payload: %v, want ErrMismatch", err)
		}
		// A live claim of Begin's.
		claimed := charge("typed-claimed", "1")
		e.leaveClaim(s, claimed, time.Minute)
		if _, _, err := callTx(e, s, claimed, run); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("a live claim: %v, want ErrInFlight", err)
		}
		// Past retention, within the key memory.
		e.age(s, req.Key, 2*time.Hour)
		if _, _, err := callTx(e, s, req, run); !errors.Is(err, idem.ErrExpired) {
			t.Fatalf("past retention: %v, want ErrExpired", err)
		}
		// fn's error stores nothing; the next call runs.
		failing := charge("typed-fails", "1")
		boom := errors.New("boom")
		_, _, err = callTx(e, s, failing, func(handle) func(context.Context) (invoice, error) {
			return func(context.Context) (invoice, error) { return invoice{}, boom }
		})
		if !errors.Is(err, boom) || e.records(s, failing.Key) != 0 {
			t.Fatalf("fn failed: %v, %d records; want boom and none", err, e.records(s, failing.Key))
		}
		// A value the codec cannot encode stores nothing either.
		_, _, err = callTx(e, s, failing, func(handle) func(context.Context) (float64, error) {
			return func(context.Context) (float64, error) { return math.NaN(), nil }
		})
		if err == nil || e.records(s, failing.Key) != 0 {
			t.Fatalf("an unencodable result: %v, %d records; want an error and none", err, e.records(s, failing.Key))
		}
		// A key Do stored an HTTP response for does not decode into a type.
		plain := charge("typed-do", "1")
		must(t, e.doOK(s, plain))
		if _, replayed, err := callTx(e, s, plain, run); err == nil || !replayed {
			t.Fatalf("a key of Do's: replayed=%v, %v; want an error saying it is not a typed call's", replayed, err)
		}

		// Sealed: the row holds no value in the clear, and replays equal.
		sealed := e.also(s, idem.WithSealer(sealerOf(t, "k1", "k1")))
		secret := charge("typed-sealed", "1")
		want.Note = "secret-note"
		for range 2 {
			v, _, err := callTx(e, sealed, secret, run)
			must(t, err)
			if !reflect.DeepEqual(v, want) {
				t.Fatalf("sealed typed call: %+v, want %+v", v, want)
			}
		}
		var body []byte
		must(t, e.db.QueryRow(e.rebind("SELECT response_body FROM "+s.Table()+" WHERE idem_key = ?"), secret.Key).Scan(&body))
		if strings.Contains(string(body), "secret-note") {
			t.Fatal("a sealed typed call stored its value in the clear")
		}
	})
}

// upperCodec is a codec of a caller's: JSON under a media type of its own.
type upperCodec struct{}

func (upperCodec) ContentType() string                { return "application/vnd.test+json" }
func (upperCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (upperCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// A key fingerprinted under one version and retried under another (a
// changed fingerprint selection) is ErrFingerprintChanged, which is also
// ErrMismatch; another payload under the same version stays a plain
// ErrMismatch. Nothing runs.
func testFingerprintChanged(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("versioned", "1")
		req.Fingerprint = idem.VersionedFingerprint("sel-a", []byte("amount=1"))
		_, err := o.do(s, req)
		must(t, err)
		changed := req
		changed.Fingerprint = idem.VersionedFingerprint("sel-b", []byte("amount=1"))
		if _, err := o.do(s, changed); !errors.Is(err, idem.ErrFingerprintChanged) || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("another version: %v, want ErrFingerprintChanged (and ErrMismatch)", err)
		}
		unversioned := req
		unversioned.Fingerprint = idem.Fingerprint([]byte("amount=1"))
		if _, err := o.do(s, unversioned); !errors.Is(err, idem.ErrFingerprintChanged) {
			t.Fatalf("no version: %v, want ErrFingerprintChanged", err)
		}
		other := req
		other.Fingerprint = idem.VersionedFingerprint("sel-a", []byte("amount=2"))
		if _, err := o.do(s, other); !errors.Is(err, idem.ErrMismatch) || errors.Is(err, idem.ErrFingerprintChanged) {
			t.Fatalf("another payload, same version: %v, want a plain ErrMismatch", err)
		}
		if res, err := o.do(s, req); err != nil || !res.Replayed {
			t.Fatalf("the same request again: %+v, %v; want a replay", res, err)
		}
		if n := o.calls.Load(); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}
