package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// A record keeps the reference its request recorded to what it created
// (Response.Reference) when the purge drops its response: a retry past
// the retention, within the key memory, is ErrExpired and its
// ExpiredError carries the reference, whether the response was stored by
// Do, a Claim's Complete or a typed Call, and whether the Store seals
// (the reference is then sealed, not stored in the clear). The purge is
// a Store's without key memory, so that the tombstone is the record's
// own doing. A replay within the retention returns the reference with the
// response; idemhttp's 410 carries it as Location and the problem's
// "reference" member. It failed before the reference was stored: the
// refusal named nothing.
func testExpiredReference(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, sealed := range []bool{false, true} {
			t.Run(map[bool]string{false: "clear", true: "sealed"}[sealed], func(t *testing.T) {
				e := e.in(t)
				const retention = time.Hour
				opts := []idem.Option{idem.WithRetention(retention)}
				if sealed {
					opts = append(opts, idem.WithSealer(sealerOf(t, "k1", "k1")))
				}
				remembering := e.store(append(opts, idem.WithKeyMemory(24*time.Hour))...)
				plain := e.elsewhere(remembering, opts...)
				o := e.op()
				created := func(key string) string { return "/v1/charges/ch_" + key }
				byDo, begun, called := charge("ref-do", "1"), charge("ref-begin", "1"), charge("ref-call", "1")
				called.Operation = "job: invoice"
				res, err := e.do(remembering, byDo, func(tx handle) func(context.Context) (idem.Response, error) {
					return func(ctx context.Context) (idem.Response, error) {
						resp, err := o.fn(tx, byDo.Key)(ctx)
						resp.Reference = created(byDo.Key)
						return resp, err
					}
				})
				must(t, err)
				if res.Reference != created(byDo.Key) {
					t.Fatalf("Do's result has the reference %q, want %q", res.Reference, created(byDo.Key))
				}
				c, _, err := remembering.Begin(ctx, e.db, begun)
				must(t, err)
				tx := e.begin(nil)
				must(t, c.Complete(ctx, tx, idem.Response{StatusCode: 201, Reference: created(begun.Key)}))
				must(t, tx.Commit())
				_, _, err = callTx(e, remembering, called, func(handle) func(context.Context) (string, error) {
					return func(context.Context) (string, error) { return "ch_call", nil }
				}, idem.WithReference(func(id string) string { return "/v1/charges/" + id }))
				must(t, err)
				replay, err := o.do(plain, byDo)
				if err != nil || !replay.Replayed || replay.Reference != created(byDo.Key) {
					t.Fatalf("a replay within the retention: %+v, %v; want the reference %q", replay, err, created(byDo.Key))
				}
				reqs := map[string]idem.Request{created(byDo.Key): byDo, created(begun.Key): begun, "/v1/charges/ch_call": called}
				for _, r := range reqs {
					e.age(remembering, r.Key, 2*retention)
				}
				n, err := plain.Purge(ctx, e.db, 10)
				must(t, err)
				if n != int64(len(reqs)) {
					t.Errorf("the purge changed %d records, want %d tombstones", n, len(reqs))
				}
				calls := o.calls.Load()
				for want, r := range reqs {
					if got := e.int64("SELECT COUNT(*) FROM "+plain.Table()+" WHERE idem_key = ? AND status = 'expired' AND response_body IS NULL AND result_ref IS NOT NULL", r.Key); got != 1 {
						t.Fatalf("%s after the purge: %d tombstones keeping a reference, want 1", r.Key, got)
					}
					var stored []byte
					must(t, e.db.QueryRow(e.rebind("SELECT result_ref FROM "+plain.Table()+" WHERE idem_key = ?"), r.Key).Scan(&stored))
					if clear := strings.Contains(string(stored), want); clear == sealed {
						t.Errorf("%s: the reference in the clear in result_ref: %v, with a sealer: %v", r.Key, clear, sealed)
					}
					for name, s := range map[string]*store{"the plain Store": plain, "the remembering Store": remembering} {
						_, err := o.do(s, r)
						expired, ok := errors.AsType[*idem.ExpiredError](err)
						if !errors.Is(err, idem.ErrExpired) || !ok || expired.Reference != want || expired.ReferenceErr != nil {
							t.Errorf("a retry of %s through %s: %v; want an ExpiredError with the reference %q", r.Key, name, err, want)
						}
					}
				}
				if got := o.calls.Load(); got != calls {
					t.Errorf("the refused retries ran fn %d times, want none", got-calls)
				}
				if sealed {
					_, err := o.do(e.elsewhere(remembering, idem.WithRetention(retention)), byDo)
					if expired, ok := errors.AsType[*idem.ExpiredError](err); !ok || expired.Reference != "" || !errors.Is(expired.ReferenceErr, idem.ErrUnsealable) {
						t.Errorf("a Store without the sealer: %v; want ErrExpired without the reference, and why", err)
					}
				}
				checkHTTPReference(t, e, remembering, plain)
			})
		}
	})
}

// checkHTTPReference checks that idemhttp's 410 past the retention
// carries the Location its first answer had, after a purge by plain.
func checkHTTPReference(t *testing.T, e *env, s, plain *store) {
	t.Helper()
	srv, _ := e.serve(idemhttp.Config{Store: s.Store}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/v1/charges/ch_http")
		w.WriteHeader(http.StatusCreated)
	}))
	first, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 1}`, `"ref-http"`)
	must(t, err)
	if first.status != http.StatusCreated {
		t.Fatalf("the first POST: %d %s", first.status, first.body)
	}
	e.age(s, "ref-http", 2*time.Hour)
	_, err = plain.Purge(ctx, e.db, 10)
	must(t, err)
	late, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 1}`, `"ref-http"`)
	must(t, err)
	var problem struct{ Type, Reference string }
	must(t, json.Unmarshal(late.body, &problem))
	if late.status != http.StatusGone || late.header.Get("Location") != "/v1/charges/ch_http" ||
		problem.Type != idemhttp.TypeExpired || problem.Reference != "/v1/charges/ch_http" {
		t.Errorf("a late retry over HTTP: %d, Location %q, %s; want 410 of type key-expired with the reference as Location and member",
			late.status, late.header.Get("Location"), late.body)
	}
}
