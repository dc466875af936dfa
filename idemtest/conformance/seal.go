package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// sealerOf is an AES-GCM sealer sealing with current, holding keys; a
// key's bytes follow from its name, so two sealers holding the same name
// hold the same key.
func sealerOf(t *testing.T, current string, keys ...string) idem.Sealer {
	t.Helper()
	m := map[string][]byte{}
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k))
		m[k] = sum[:]
	}
	s, err := idem.NewAESGCMSealer(current, m)
	must(t, err)
	return s
}

// also is a Store on s's table with other options, as another process of
// the service configured anew has.
func (e *env) also(s *store, opts ...idem.Option) *store {
	e.t.Helper()
	o, err := idem.New(e.Dialect, append([]idem.Option{idem.WithTable(s.Table())}, opts...)...)
	must(e.t, err)
	return e.onDriver(o)
}

// A sealed response is stored sealed: neither its body nor its header is
// in the row in the clear, and the key's name is beside it; it replays
// byte for byte. A Store without the key cannot replay it: its error names
// the key and the record, and nothing runs. A record stored in the clear
// before the sealer still replays.
func testSealedResponses(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		plain, o := e.store(), e.op()
		before := charge("before-sealing", "1")
		first, err := o.do(plain, before)
		must(t, err)
		s := e.also(plain, idem.WithSealer(sealerOf(t, "k1", "k1")))
		req := charge("sealed", "1")
		var stored idem.Result
		stored, err = e.do(s, req, func(tx handle) func(context.Context) (idem.Response, error) {
			return func(context.Context) (idem.Response, error) {
				o.calls.Add(1)
				return idem.Response{StatusCode: 201, Header: http.Header{"Location": {"/v1/charges/ch_4242"}}, Body: []byte(`{"last4":"4242"}`)}, nil
			}
		})
		must(t, err)
		var body []byte
		var sealedKey string
		must(t, e.db.QueryRow(e.rebind("SELECT response_body, sealed_key FROM "+s.Table()+" WHERE idem_key = ?"), req.Key).Scan(&body, &sealedKey))
		if bytes.Contains(body, []byte("4242")) || sealedKey != "k1" {
			t.Fatalf("the stored body %q, sealed with %q; want it sealed with k1", body, sealedKey)
		}
		res, err := o.do(s, req)
		must(t, err)
		if !res.Replayed || !bytes.Equal(res.Body, stored.Body) || res.Header.Get("Location") != "/v1/charges/ch_4242" {
			t.Fatalf("the sealed replay: %+v", res)
		}
		if res, err := o.do(s, before); err != nil || !res.Replayed || !bytes.Equal(res.Body, first.Body) {
			t.Fatalf("a record stored in the clear, replayed by a sealing Store: %+v, %v", res, err)
		}
		for name, other := range map[string]*store{
			"no sealer":   plain,
			"another key": e.also(plain, idem.WithSealer(sealerOf(t, "k2", "k2"))),
		} {
			_, err := o.do(other, req)
			var ie *idem.Error
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), `sealed with key "k1"`) || ie.Key != req.Key || ie.Hint == "" {
				t.Errorf("%s: %v; want an Error naming the key k1 and the record", name, err)
			}
		}
		r, err := plain.Inspect(ctx, e.db, req.Scope, req.Key)
		must(t, err)
		if r.SealedKey != "k1" || r.Response != nil {
			t.Errorf("Inspect without the key: sealed with %q, response %v; want k1 and none", r.SealedKey, r.Response)
		}
		r, err = s.Inspect(ctx, e.db, req.Scope, req.Key)
		must(t, err)
		if r.SealedKey != "k1" || r.Response == nil || !bytes.Equal(r.Response.Body, stored.Body) {
			t.Errorf("Inspect with the key: %+v", r)
		}
		if got := o.calls.Load(); got != 2 {
			t.Fatalf("fn ran %d times, want 2", got)
		}
	})
}

// A sealed row that was changed, or copied onto another key, does not
// open: an error, never a replay of what it opens to, never a run; and a
// mismatch is refused before anything is opened.
func testSealedRowsTampered(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(idem.WithSealer(sealerOf(t, "k1", "k1"))), e.op()
		for _, k := range []string{"victim", "donor", "tampered"} {
			_, err := o.do(s, charge(k, "1"))
			must(t, err)
		}
		e.exec("UPDATE "+s.Table()+" SET response_body = (SELECT response_body FROM (SELECT response_body FROM "+s.Table()+" WHERE idem_key = ?) d) WHERE idem_key = ?", "donor", "victim")
		var body []byte
		must(t, e.db.QueryRow(e.rebind("SELECT response_body FROM "+s.Table()+" WHERE idem_key = ?"), "tampered").Scan(&body))
		body[len(body)-1] ^= 1
		e.exec("UPDATE "+s.Table()+" SET response_body = ? WHERE idem_key = ?", body, "tampered")
		for _, k := range []string{"victim", "tampered"} {
			if _, err := o.do(s, charge(k, "1")); err == nil || !strings.Contains(err.Error(), "does not open") {
				t.Errorf("%s: %v; want an error that it does not open", k, err)
			}
			if _, err := o.do(s, charge(k, "2")); !errors.Is(err, idem.ErrMismatch) {
				t.Errorf("%s with another payload: %v; want ErrMismatch", k, err)
			}
		}
		if got := o.calls.Load(); got != 3 {
			t.Fatalf("fn ran %d times, want 3", got)
		}
	})
}

// A rotation mid-traffic, as docs/operations.md lays it out: every
// instance has the new key to open with while the old one still seals;
// then, while 16 workers replay records sealed with the old key and store
// new ones, their Stores are given a sealer that seals with the new key
// (and still opens the old), and Reseal rewrites every record under the
// new key; every replay is byte for byte what was stored, every
// key ran once, and at the end a Store that has the new key only opens
// every record.
func testRotationMidTraffic(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const workers, keys = 16, 8
		oldSealer := sealerOf(t, "k1", "k1", "k2")
		rotated := sealerOf(t, "k2", "k1", "k2")
		s, o := e.store(idem.WithSealer(oldSealer)), e.op()
		for i := range keys {
			_, err := o.do(s, charge(fmt.Sprintf("old-%d", i), "1"))
			must(t, err)
		}
		after := e.also(s, idem.WithSealer(rotated))
		errs := make([]error, workers)
		var (
			wg       sync.WaitGroup
			rotating atomic.Bool
		)
		stop := make(chan struct{})
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					st := s
					if rotating.Load() {
						st = after
					}
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("old-%d", i%keys)
					if i%4 == 3 {
						key = fmt.Sprintf("new-%d-%d", w, i)
					}
					res, err := o.do(st, charge(key, "1"))
					if err != nil {
						errs[w] = fmt.Errorf("worker %d, %s: %w", w, key, err)
						return
					}
					if !strings.Contains(string(res.Body), fmt.Sprintf("%q", key)) {
						errs[w] = fmt.Errorf("worker %d, %s: replayed %q", w, key, res.Body)
						return
					}
				}
			})
		}
		time.Sleep(50 * time.Millisecond)
		rotating.Store(true)
		n, err := after.Reseal(ctx, e.db, 3)
		close(stop)
		wg.Wait()
		must(t, errors.Join(append(errs, err)...))
		if n < keys {
			t.Fatalf("Reseal rewrote %d records, want at least the %d old ones", n, keys)
		}
		_, err = after.Reseal(ctx, e.db, 3) // what a worker completed on the old sealer while Reseal ran
		must(t, err)
		if old := e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE sealed_key <> ?", "k2"); old != 0 {
			t.Fatalf("%d records still sealed with another key than k2 after Reseal", old)
		}
		newOnly := e.also(s, idem.WithSealer(sealerOf(t, "k2", "k2")))
		for i := range keys {
			if res, err := o.do(newOnly, charge(fmt.Sprintf("old-%d", i), "1")); err != nil || !res.Replayed {
				t.Fatalf("old-%d with the new key only: %+v, %v", i, res, err)
			}
		}
		rows, runs, distinct := e.int64("SELECT COUNT(*) FROM "+o.biz), o.calls.Load(), e.int64("SELECT COUNT(DISTINCT k) FROM "+o.biz)
		if e.RerunsFn != "" {
			t.Logf("%d runs for %d keys: %s", runs, distinct, e.RerunsFn)
			runs = distinct
		}
		if rows != runs || distinct != runs {
			t.Fatalf("%d business rows, %d runs: a key ran twice", rows, runs)
		}
	})
}
