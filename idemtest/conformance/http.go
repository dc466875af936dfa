package conformance

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
)

// chargeAPI is a handler that inserts a business row (k = the key, v = the
// amount) through its transaction (the TxFrom of the target's driver) and
// answers with what respond writes.
type chargeAPI struct {
	e       *env
	biz     string
	calls   atomic.Int64
	delay   time.Duration
	respond func(w http.ResponseWriter, run int64) // default: 201 with the run number
}

func (e *env) chargeAPI() *chargeAPI { return &chargeAPI{e: e, biz: e.business()} }

func (a *chargeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := a.calls.Add(1)
	tx := a.e.txFrom(r.Context())
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var in struct{ Amount json.Number }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
		return
	}
	key := "(none)"
	if req, ok := idemhttp.RequestFrom(r.Context()); ok {
		key = req.Key
	}
	if _, err := tx.ExecContext(r.Context(), a.e.rebind("INSERT INTO "+a.biz+" (k, v) VALUES (?, ?)"), key, in.Amount.String()); err != nil {
		http.Error(w, "insert: "+err.Error(), http.StatusInternalServerError)
		return
	}
	time.Sleep(a.delay)
	if a.respond != nil {
		a.respond(w, run)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/charges/"+key)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"amount":%s,"run":%d}`, key, in.Amount, run)
}

// callerHeader names the caller of a test request: the tests' stand-in
// for authentication.
const callerHeader = "X-Caller"

// byCaller is the tests' Config.Scope: the caller the request names, or a
// 401 when it names none.
func byCaller(r *http.Request) (string, error) {
	caller := r.Header.Get(callerHeader)
	if caller == "" {
		return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "name the caller in " + callerHeader}
	}
	return "user:" + caller, nil
}

// serve starts a loopback server running h behind the middleware on the
// target's pool, with cfg's Store defaulting to a fresh store on the
// target and its Scope to byCaller.
func (e *env) serve(cfg idemhttp.Config, h http.Handler) (*httptest.Server, *idem.Store) {
	e.t.Helper()
	return e.serveOn(e.db, cfg, h)
}

// serveOn is serve with the middleware on db, a pool of the target.
func (e *env) serveOn(db pool, cfg idemhttp.Config, h http.Handler) (*httptest.Server, *idem.Store) {
	e.t.Helper()
	if cfg.Store == nil {
		cfg.Store = e.store().Store
	}
	if cfg.Scope == nil {
		cfg.Scope = byCaller
	}
	m, err := e.middleware(db, cfg)
	must(e.t, err)
	srv := httptest.NewUnstartedServer(m.Handler(h))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's stack trace
	srv.Start()
	e.t.Cleanup(srv.Close)
	return srv, cfg.Store
}

// response is an answer read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(idemhttp.HeaderIdempotentReplayed) == "true" }

// post sends one POST as the caller alice with the given Idempotency-Key
// field lines.
func post(client *http.Client, url, body string, keys ...string) (response, error) {
	return postAs(client, "alice", url, body, keys...)
}

// postAs sends one POST as caller with the given Idempotency-Key field
// lines.
func postAs(client *http.Client, caller, url, body string, keys ...string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(callerHeader, caller)
	for _, k := range keys {
		req.Header.Add(idemhttp.HeaderIdempotencyKey, k)
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// retryingPost is the client retry recipe of docs/http.md: retry on 409,
// 5xx and transport errors with exponential backoff and full jitter,
// waiting at least Retry-After when the server sends it, with the same key
// and body every time. conflicts counts the 409s seen.
func retryingPost(ctx context.Context, client *http.Client, url, body, key string) (resp response, conflicts int, err error) {
	backoff := 50 * time.Millisecond
	for {
		resp, err = post(client, url, body, key)
		if err == nil && resp.status != http.StatusConflict && resp.status < 500 {
			return resp, conflicts, nil
		}
		wait := rand.N(backoff) + 1
		if err == nil {
			if resp.status == http.StatusConflict {
				conflicts++
			}
			if s, perr := strconv.Atoi(resp.header.Get("Retry-After")); perr == nil {
				wait = max(wait, time.Duration(s)*time.Second)
			}
		}
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-ctx.Done():
			return resp, conflicts, fmt.Errorf("gave up: %w (last: %v, status %d)", ctx.Err(), err, resp.status)
		case <-time.After(wait):
		}
	}
}

// retryingClients starts n clients at once, each sending body with key to
// url through retryingPost. The returned wait waits for them, reports each
// client's error on t and returns the others' responses; with needConflict,
// a client that never saw a 409 is an error.
func retryingClients(ctx context.Context, n int, client *http.Client, url, body, key string, needConflict bool) (wait func(t *testing.T) []response) {
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		responses []response
		errs      []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			r, conflicts, err := retryingPost(ctx, client, url, body, key)
			if err == nil && needConflict && conflicts == 0 {
				err = errors.New("the client saw no 409 while the key was held")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			responses = append(responses, r)
		})
	}
	close(start)
	return func(t *testing.T) []response {
		t.Helper()
		wg.Wait()
		for _, err := range errs {
			t.Errorf("client: %v", err)
		}
		return responses
	}
}

// problem is an RFC 9457 body.
type problem struct {
	Type, Title, Detail string
	Status              int
}

// checkProblem asserts that r is a problem of the status and type, with a
// detail holding fragment.
func checkProblem(t *testing.T, r response, status int, typ, fragment string) problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	if p.Status != status || p.Type != typ || p.Title == "" || !strings.Contains(p.Detail, fragment) {
		t.Fatalf("problem %+v; want status %d, type %s, a title, detail with %q", p, status, typ, fragment)
	}
	return p
}

// checkRetryAfter asserts that r's Retry-After is the remaining time of a
// lease taken moments ago: whole seconds, at least 1 and at most lease
// rounded up (less when a loaded machine took a while to answer).
func checkRetryAfter(t *testing.T, r response, lease time.Duration) {
	t.Helper()
	ra := r.header.Get("Retry-After")
	secs, err := strconv.Atoi(ra)
	if most := int((lease + time.Second - 1) / time.Second); err != nil || secs < 1 || secs > most {
		t.Fatalf("Retry-After %q, want the lease's remaining 1 to %d seconds", ra, most)
	}
}

// 50 concurrent identical POSTs with one key make exactly one charge; the
// other 49 get its response replayed byte for byte, under the default
// isolation level and under SERIALIZABLE (where RunTx retries the losers).
func testHTTPConcurrentDuplicates(t *testing.T) {
	const clients = 50
	forEach(t, func(t *testing.T, e *env) {
		for _, opts := range []*sql.TxOptions{nil, {Isolation: sql.LevelSerializable}} {
			name := "default"
			if opts != nil {
				name = levelName(opts.Isolation)
			}
			t.Run(name, func(t *testing.T) {
				e := e.in(t)
				if opts != nil {
					e.skipLevel(opts.Isolation)
				}
				api := e.chargeAPI()
				api.delay = 50 * time.Millisecond
				srv, _ := e.serve(idemhttp.Config{TxOptions: opts}, api)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				responses := retryingClients(ctx, clients, srv.Client(), srv.URL+"/v1/charges", `{"amount": 100}`, "storm-1", false)(t)
				if n := e.count(api.biz, "storm-1"); n != 1 {
					t.Fatalf("%d charge rows, want exactly 1", n)
				}
				fresh, replays := 0, 0
				for _, r := range responses {
					if r.status != http.StatusCreated || !bytes.Equal(r.body, responses[0].body) {
						t.Errorf("response %d %s differs from %d %s", r.status, r.body, responses[0].status, responses[0].body)
					}
					if r.replayed() {
						replays++
					} else {
						fresh++
					}
				}
				if fresh != 1 || replays != clients-1 {
					t.Fatalf("%d fresh and %d replayed responses, want 1 and %d (handler ran %d times)", fresh, replays, clients-1, api.calls.Load())
				}
			})
		}
	})
}

// probe returns the idem.Request the middleware makes of a POST of body
// to path with key, without storing anything (it answers 500).
func probe(t *testing.T, e *env, s *idem.Store, path, body, key string) idem.Request {
	t.Helper()
	var req idem.Request
	srv, _ := e.serve(idemhttp.Config{Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ = idemhttp.RequestFrom(r.Context())
		w.WriteHeader(http.StatusInternalServerError)
	}))
	r, err := post(srv.Client(), srv.URL+path, body, key)
	must(t, err)
	if r.status != http.StatusInternalServerError || req.Key != key {
		t.Fatalf("probe: %d, request %+v", r.status, req)
	}
	return req
}

// A key held by a live claim is a 409 with Retry-After; clients that retry
// with backoff, honouring it, converge: one runs the handler once the
// lease ends, the others replay its response.
func testHTTPRetryingClientsConverge(t *testing.T) {
	const clients = 5
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, s := e.serve(idemhttp.Config{}, api)
		body := `{"amount": 250}`
		e.leaveClaim(e.onDriver(s), probe(t, e, s, "/v1/charges", body, "converge-1"), 2500*time.Millisecond)

		first, err := post(srv.Client(), srv.URL+"/v1/charges", body, "converge-1")
		must(t, err)
		checkProblem(t, first, http.StatusConflict, idemhttp.TypeInFlight, "retry after")
		checkRetryAfter(t, first, 2500*time.Millisecond)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		responses := retryingClients(ctx, clients, srv.Client(), srv.URL+"/v1/charges", body, "converge-1", true)(t)
		if n := e.count(api.biz, "converge-1"); n != 1 || api.calls.Load() != 1 {
			t.Fatalf("%d charge rows, handler ran %d times; want 1 and 1", n, api.calls.Load())
		}
		replays := 0
		for _, r := range responses {
			if r.status != http.StatusCreated || !bytes.Equal(r.body, responses[0].body) {
				t.Errorf("response %d %s differs from %d %s", r.status, r.body, responses[0].status, responses[0].body)
			}
			if r.replayed() {
				replays++
			}
		}
		if replays != clients-1 {
			t.Fatalf("%d replays, want %d", replays, clients-1)
		}
	})
}

// The sf-string and bare-token forms name the same key; malformed fields
// are 400s; a missing key passes through (twice is two charges) unless
// Required.
func testHTTPHeaderForms(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, _ := e.serve(idemhttp.Config{}, api)
		url, c := srv.URL+"/v1/charges", srv.Client()
		send := func(keys ...string) response {
			t.Helper()
			r, err := post(c, url, `{"amount": 1}`, keys...)
			must(t, err)
			return r
		}

		for _, pair := range [][2]string{{`"form-1"`, "form-1"}, {"form-2", `"form-2"`}, {`"a\\b"`, `a\b`}} {
			if r := send(pair[0]); r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("%s: %d replayed=%v %s", pair[0], r.status, r.replayed(), r.body)
			}
			if r := send(pair[1]); r.status != http.StatusCreated || !r.replayed() {
				t.Fatalf("%s after %s: %d replayed=%v, want a replay", pair[1], pair[0], r.status, r.replayed())
			}
		}
		if r := send(`"a\"b"`); r.status != http.StatusCreated {
			t.Fatalf(`escaped quote: %d %s`, r.status, r.body)
		}
		if n := e.count(api.biz, `a"b`); n != 1 {
			t.Fatalf(`key a"b: %d rows, want 1`, n)
		}

		for keys, fragment := range map[[2]string]string{
			{"k1", "k2"}:     "2 Idempotency-Key field lines",
			{`"k1", "k2"`}:   "list",
			{"k1,k2"}:        "list",
			{`""`}:           "empty",
			{`"has space"`}:  "not visible ASCII",
			{`"unfinished`}:  "closing double quote",
			{`"k1";param=1`}: "after it",
		} {
			var lines []string
			for _, k := range keys {
				if k != "" {
					lines = append(lines, k)
				}
			}
			checkProblem(t, send(lines...), http.StatusBadRequest, idemhttp.TypeInvalidKey, fragment)
		}

		for range 2 {
			if r := send(); r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("no key: %d replayed=%v", r.status, r.replayed())
			}
		}
		if n := e.count(api.biz, "(none)"); n != 2 {
			t.Fatalf("two requests without a key made %d rows, want 2", n)
		}

		required, _ := e.serve(idemhttp.Config{Required: true}, api)
		r, err := post(c, required.URL+"/v1/charges", `{"amount": 1}`)
		must(t, err)
		checkProblem(t, r, http.StatusBadRequest, idemhttp.TypeMissingKey, "requires an Idempotency-Key")
	})
}

// 400, 413 and 422 answers: problem bodies, and no database work for the
// first two (the middleware's DB is closed, so any use would be a 500); a
// body of exactly MaxBody passes.
func testHTTPProblems(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, s := e.serve(idemhttp.Config{MaxBody: 64}, api)
		c := srv.Client()

		noDB, _ := e.serveOn(e.closedPool(), idemhttp.Config{Store: s, MaxBody: 64}, api)
		big := `{"amount": 1, "pad": "` + strings.Repeat("x", 64) + `"}`
		r, err := post(c, noDB.URL+"/v1/charges", big, "big-1")
		must(t, err)
		checkProblem(t, r, http.StatusRequestEntityTooLarge, idemhttp.TypeBodyTooLarge, "over 64 bytes")
		r, err = post(c, noDB.URL+"/v1/charges", `{"amount": 1}`, "bad key")
		must(t, err)
		checkProblem(t, r, http.StatusBadRequest, idemhttp.TypeInvalidKey, "not visible ASCII")

		// A body over MaxBody without a Content-Length (chunked) is a 413 too.
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", io.MultiReader(strings.NewReader(big)))
		must(t, err)
		req.Header.Set("Idempotency-Key", "big-2")
		resp, err := c.Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || req.ContentLength != 0 {
			t.Fatalf("chunked oversize body: %d (sent with Content-Length %d)", resp.StatusCode, req.ContentLength)
		}

		// A body of exactly MaxBody bytes reaches the handler whole (it
		// decodes the JSON, which a truncated body would fail).
		exact := `{"amount": 1, "pad": "` + strings.Repeat("x", 64-24) + `"}`
		r, err = post(c, srv.URL+"/v1/charges", exact, "exact-1")
		must(t, err)
		if len(exact) != 64 || r.status != http.StatusCreated {
			t.Fatalf("a body of %d bytes, MaxBody 64: %d %s", len(exact), r.status, r.body)
		}

		r, err = post(c, srv.URL+"/v1/charges", `{"amount": 1}`, "reuse-1")
		must(t, err)
		if r.status != http.StatusCreated {
			t.Fatalf("first use: %d %s", r.status, r.body)
		}
		r, err = post(c, srv.URL+"/v1/charges", "{\n  \"amount\" :1 }", "reuse-1")
		must(t, err)
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("the same JSON with other whitespace: %d replayed=%v %s; want a replay", r.status, r.replayed(), r.body)
		}
		r, err = post(c, srv.URL+"/v1/charges", `{"amount": 2}`, "reuse-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeMismatch, "a new request needs a new key")
		r, err = post(c, srv.URL+"/v1/refunds", `{"amount": 1}`, "reuse-1")
		must(t, err)
		checkProblem(t, r, http.StatusUnprocessableEntity, idemhttp.TypeMismatch, "different request")
		if n := api.calls.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2 (exact-1 and reuse-1)", n)
		}
	})
}

// A fresh answer carries every header the handler set; its replay only the
// allow-listed ones, never Set-Cookie, which is not even stored. A 4xx is a
// result: stored and replayed.
func testHTTPReplayHeaders(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		api.respond = func(w http.ResponseWriter, run int64) {
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Location", "/v1/charges/ch_1")
			h.Set("ETag", `"v1"`)
			h.Add("X-Request-Cost", "3")
			h.Add("X-Request-Cost", "4")
			h.Set("X-Internal", "secret")
			h.Set("Set-Cookie", "session=abc; HttpOnly")
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprintf(w, `{"declined":true,"run":%d}`, run)
		}
		srv, s := e.serve(idemhttp.Config{ReplayHeaders: []string{"x-request-cost"}}, api)
		first, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 7}`, "headers-1")
		must(t, err)
		second, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 7}`, "headers-1")
		must(t, err)
		if first.status != 402 || second.status != 402 || !bytes.Equal(first.body, second.body) || api.calls.Load() != 1 {
			t.Fatalf("402 not replayed: %d %s, %d %s, %d runs", first.status, first.body, second.status, second.body, api.calls.Load())
		}
		for _, name := range []string{"X-Internal", "Set-Cookie"} {
			if first.header.Get(name) == "" {
				t.Errorf("fresh answer lost %s", name)
			}
			if v := second.header.Values(name); len(v) != 0 {
				t.Errorf("replay carries %s: %q", name, v)
			}
		}
		if first.replayed() || !second.replayed() {
			t.Errorf("Idempotent-Replayed: fresh %q, replay %q", first.header.Get("Idempotent-Replayed"), second.header.Get("Idempotent-Replayed"))
		}
		for name, want := range map[string]string{"Content-Type": "application/json", "Location": "/v1/charges/ch_1", "Etag": `"v1"`, "X-Request-Cost": "3,4"} {
			if got := strings.Join(second.header.Values(name), ","); got != want {
				t.Errorf("replayed %s = %q, want %q", name, got, want)
			}
		}
		var stored []byte
		must(t, e.db.QueryRow(e.rebind("SELECT response_headers FROM "+s.Table()+" WHERE idem_key = ?"), "headers-1").Scan(&stored))
		if bytes.Contains(stored, []byte("Set-Cookie")) || bytes.Contains(stored, []byte("secret")) {
			t.Errorf("stored header holds a field off the allow-list: %q", stored)
		}

		if _, err := e.middleware(e.db, idemhttp.Config{Store: s, Scope: byCaller, ReplayHeaders: []string{"set-cookie"}}); err == nil {
			t.Error("New accepted Set-Cookie in ReplayHeaders")
		}
	})
}

// A 5xx answer or a panic rolls back the handler's rows and stores
// nothing, so the retry runs again; StoreServerErrors makes a 5xx a result.
func testHTTPFailuresNotStored(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, failure := range []string{"503", "panic"} {
			t.Run(failure, func(t *testing.T) {
				e := e.in(t)
				api := e.chargeAPI()
				api.respond = func(w http.ResponseWriter, run int64) {
					if run == 1 {
						if failure == "panic" {
							panic("card network exploded")
						}
						w.Header().Set("Retry-After", "0")
						http.Error(w, "provider down", http.StatusServiceUnavailable)
						return
					}
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, "run %d", run)
				}
				srv, s := e.serve(idemhttp.Config{}, api)
				// No keep-alive: a request on a fresh connection that dies is
				// not retried by the transport on its own.
				c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
				r, err := post(c, srv.URL+"/v1/charges", `{"amount": 3}`, "fail-"+failure)
				switch failure {
				case "panic":
					if err == nil {
						t.Fatalf("the panic reached the client as %d %s; want a dropped connection", r.status, r.body)
					}
				default:
					must(t, err)
					if r.status != 503 || !strings.Contains(string(r.body), "provider down") || r.header.Get("Retry-After") != "0" {
						t.Fatalf("the handler's 503 was not passed on: %d %q %v", r.status, r.body, r.header)
					}
				}
				if n, rec := e.count(api.biz, "fail-"+failure), e.records(s, "fail-"+failure); n != 0 || rec != 0 {
					t.Fatalf("after the failure: %d rows, %d records; want 0, 0", n, rec)
				}
				r, err = post(c, srv.URL+"/v1/charges", `{"amount": 3}`, "fail-"+failure)
				must(t, err)
				if r.status != 201 || r.replayed() || string(r.body) != "run 2" {
					t.Fatalf("retry: %d replayed=%v %q, want a fresh run 2", r.status, r.replayed(), r.body)
				}
				if n := e.count(api.biz, "fail-"+failure); n != 1 {
					t.Fatalf("%d rows after the retry, want 1", n)
				}
			})
		}

		t.Run("stored", func(t *testing.T) {
			e := e.in(t)
			api := e.chargeAPI()
			api.respond = func(w http.ResponseWriter, run int64) {
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprintf(w, "run %d", run)
			}
			srv, _ := e.serve(idemhttp.Config{StoreServerErrors: true}, api)
			for i := range 2 {
				r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 3}`, "fail-stored")
				must(t, err)
				if r.status != 500 || string(r.body) != "run 1" || r.replayed() != (i == 1) {
					t.Fatalf("request %d: %d %q replayed=%v", i, r.status, r.body, r.replayed())
				}
			}
			if n := e.count(api.biz, "fail-stored"); n != 1 {
				t.Fatalf("%d rows, want 1 committed with the stored 500", n)
			}
		})
	})
}

// A handler that flushes or hijacks is refused with a 500 problem and
// rolled back, in both modes (in ModeClaim its claim is released);
// ResponseController reports ErrStreaming to it.
func testHTTPStreamingRefused(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			for _, how := range []string{"Flush", "Hijack"} {
				streamingRefusedCase(t, e, mode, how)
			}
		}
	})
}

// streamingRefusedCase runs one case of TestHTTPStreamingRefused.
func streamingRefusedCase(t *testing.T, e *env, mode idemserve.Mode, how string) {
	t.Run(fmt.Sprintf("%s/claim=%v", how, mode == idemserve.ModeClaim), func(t *testing.T) {
		e := e.in(t)
		api := e.chargeAPI()
		var got error
		api.respond = func(w http.ResponseWriter, _ int64) {
			fmt.Fprint(w, "part 1")
			switch how {
			case "Flush":
				w.(http.Flusher).Flush()
				got = http.NewResponseController(w).Flush()
			case "Hijack":
				_, _, got = w.(http.Hijacker).Hijack()
			}
			fmt.Fprint(w, "part 2")
		}
		srv, s := e.serve(idemhttp.Config{Mode: mode}, api)
		r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 5}`, "stream-1")
		must(t, err)
		checkProblem(t, r, http.StatusInternalServerError, idemhttp.TypeStreaming, "called "+how)
		if !errors.Is(got, idemhttp.ErrStreaming) {
			t.Fatalf("the handler got %v, want ErrStreaming", got)
		}
		released := e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE idem_key = ? AND status = 'released'", "stream-1")
		n, rec := e.count(api.biz, "stream-1"), e.records(s, "stream-1")
		want := 0 // nothing stored
		if mode == idemserve.ModeClaim {
			want = 1 // the claim, released
		}
		if n != 0 || rec != want || released != int64(want) {
			t.Fatalf("%d rows, %d records, %d released; want 0, %d, %d", n, rec, released, want, want)
		}
	})
}

// Scope may read the body: one key sent for two accounts named in the
// body is two keys, and the handler still reads the whole body.
func testHTTPScopeReadsBody(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, _ := e.serve(idemhttp.Config{Scope: func(r *http.Request) (string, error) {
			var in struct{ Account string }
			err := json.NewDecoder(r.Body).Decode(&in)
			return in.Account, err
		}}, api)
		for _, account := range []string{"acct-1", "acct-2"} {
			r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"account": "`+account+`", "amount": 4}`, "scoped-1")
			must(t, err)
			if r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("%s: %d replayed=%v %s; want a fresh 201 in its own scope", account, r.status, r.replayed(), r.body)
			}
		}
		if n := e.count(api.biz, "scoped-1"); n != 2 {
			t.Fatalf("%d rows, want 2", n)
		}
	})
}

// Methods outside Config.Methods pass through with no transaction.
func testHTTPPassThrough(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		var sawTx atomic.Bool
		srv, _ := e.serve(idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sawTx.Store(e.txFrom(r.Context()) != nil)
			fmt.Fprint(w, r.Method)
		}))
		req, err := http.NewRequest(http.MethodPut, srv.URL+"/v1/charges/1", strings.NewReader("x"))
		must(t, err)
		req.Header.Set("Idempotency-Key", "bad key ignored for PUT")
		resp, err := srv.Client().Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != 200 || sawTx.Load() || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("PUT: %d, transaction %v", resp.StatusCode, sawTx.Load())
		}
	})
}
