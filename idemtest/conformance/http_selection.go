package conformance

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// A route that counts selected fields of its JSON body replays a retry
// whose volatile fields changed, refuses one whose counted field changed
// or went missing (422), refuses a body that is not JSON before anything
// runs (415), and after its selection changed tells a retry of an older
// key so (422 of its own type), running nothing. Business rows are
// counted: one per key that ran.
func testHTTPFingerprintSelection(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, s := e.serve(idemhttp.Config{FingerprintFields: []string{"/amount", "/currency"}, FingerprintIgnore: []string{"/currency/note"}}, api)
		c := srv.Client()
		url := srv.URL + "/v1/charges"

		r, err := post(c, url, `{"amount":100,"currency":"eur","sent_at":"12:00:00","retry":0}`, "sel-1")
		must(t, err)
		if r.status != http.StatusCreated {
			t.Fatalf("first request: %d %s", r.status, r.body)
		}
		r, err = post(c, url, `{"retry":1, "sent_at":"12:00:07", "currency":"eur", "amount":100, "trace":"abc"}`, "sel-1")
		must(t, err)
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("a retry with other volatile fields: %d replayed=%v %s; want the stored 201 replayed", r.status, r.replayed(), r.body)
		}
		r, err = post(c, url, `{"amount":1000,"currency":"eur","sent_at":"12:00:09"}`, "sel-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeMismatch, "different request")
		r, err = post(c, url, `{"currency":"eur","sent_at":"12:00:09"}`, "sel-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeMismatch, "different request")

		// A counted field absent at first counts as absent: the same
		// body without it replays, one that adds it is another request.
		r, err = post(c, url, `{"currency":"eur","amount":5,"sent_at":"1"}`, "sel-2")
		must(t, err)
		if r.status != http.StatusCreated {
			t.Fatalf("first request of sel-2: %d %s", r.status, r.body)
		}
		r, err = post(c, url, `{"amount":7}`, "sel-3")
		must(t, err)
		r2, err := post(c, url, `{"amount":7,"sent_at":"2"}`, "sel-3")
		must(t, err)
		if r.status != http.StatusCreated || !r2.replayed() {
			t.Fatalf("absent currency twice: %d then replayed=%v %s", r.status, r2.replayed(), r2.body)
		}
		r, err = post(c, url, `{"amount":7,"currency":null}`, "sel-3")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeMismatch, "different request")

		// A body that is not JSON is refused before the Store sees it.
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("amount=100"))
		must(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(callerHeader, "alice")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, "sel-form")
		resp, err := c.Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || e.records(s, "sel-form") != 0 {
			t.Fatalf("a form body: %d, %d records; want 415 and none", resp.StatusCode, e.records(s, "sel-form"))
		}
		r, err = post(c, url, `{"amount":1,"AMOUNT":2}`, "sel-dup")
		must(t, err)
		checkProblem(t, r, http.StatusBadRequest, idemhttp.TypeBodyInvalidJSON, "appears twice")

		// The route's selection changes (a new deploy on the same table):
		// a retry of a key stored before is told so; nothing runs.
		changed, _ := e.serve(idemhttp.Config{Store: s, FingerprintFields: []string{"/amount"}}, api)
		r, err = post(changed.Client(), changed.URL+"/v1/charges", `{"amount":100,"currency":"eur","sent_at":"12:00:00","retry":0}`, "sel-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeFingerprintChanged, "changed which parts")
		whole, _ := e.serve(idemhttp.Config{Store: s}, api)
		r, err = post(whole.Client(), whole.URL+"/v1/charges", `{"amount":100,"currency":"eur","sent_at":"12:00:00","retry":0}`, "sel-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeFingerprintChanged, "changed which parts")

		if n, rows := api.calls.Load(), e.int64("SELECT COUNT(*) FROM "+api.biz); n != 3 || rows != 3 {
			t.Fatalf("the handler ran %d times, %d business rows; want 3, 3 (sel-1, sel-2, sel-3)", n, rows)
		}
	})
}
