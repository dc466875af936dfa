package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
)

// provider is a slow downstream service that, like a real payment
// provider, is idempotent by its own key: a key it has charged returns the
// first charge.
type provider struct {
	mu      sync.Mutex
	calls   map[string]int
	charges map[string]string
	hold    chan struct{} // if not nil, the first call waits until it is closed (holdFirst)
	fail    func(call int) bool
	started chan struct{} // if not nil, gets a value at the start of a call while it has room
	delay   time.Duration // how long each call takes, unless its context ends first
	deaf    bool          // the held first call ignores its context's end
}

func newProvider() *provider {
	return &provider{calls: map[string]int{}, charges: map[string]string{}}
}

// holdFirst makes the provider's first call wait until release is called,
// and report the start of its first calls (as many as calls) to
// waitStarted. Defer release too: a test that fails while the call is held
// must still end, not hang in the server's Close waiting for the handler.
func (p *provider) holdFirst(calls int) (release func()) {
	p.hold = make(chan struct{})
	p.started = make(chan struct{}, calls)
	return sync.OnceFunc(func() { close(p.hold) })
}

// waitStarted waits for the start of the provider's next call.
func (p *provider) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-p.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider was not called within 30s")
	}
}

var errProviderDown = errors.New("provider unavailable")

func (p *provider) charge(ctx context.Context, key string) (string, error) {
	p.mu.Lock()
	p.calls[key]++
	n := 0
	for _, c := range p.calls {
		n += c
	}
	p.mu.Unlock()
	if p.started != nil {
		select {
		case p.started <- struct{}{}:
		default: // more calls than the test waits for: never block the handler
		}
	}
	if p.hold != nil && n == 1 {
		done := ctx.Done()
		if p.deaf {
			done = nil
		}
		select {
		case <-p.hold:
		case <-done:
			return "", ctx.Err()
		}
	}
	if p.delay > 0 {
		select {
		case <-time.After(p.delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if p.fail != nil && p.fail(n) {
		return "", errProviderDown
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ref, ok := p.charges[key]; ok {
		return ref, nil
	}
	ref := fmt.Sprintf("pr_%d", len(p.charges)+1)
	p.charges[key] = ref
	return ref, nil
}

// only returns the one key the provider was called with, and how often.
func (p *provider) only(t *testing.T) (key string, calls int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.calls) != 1 || len(p.charges) != 1 {
		t.Fatalf("the provider saw keys %v and charged %v; want one key, charged once", p.calls, p.charges)
	}
	for k, n := range p.calls {
		key, calls = k, n
	}
	return key, calls
}

// claimAPI is a ModeClaim handler: it charges through the provider with the
// claim's RelayKey and no transaction open, then records the charge through
// its transaction, which the TxFrom of the target's driver begins.
type claimAPI struct {
	e      *env
	biz    string
	p      *provider
	runs   atomic.Int64
	panics func(run int64) bool
}

func (e *env) claimAPI(p *provider) *claimAPI { return &claimAPI{e: e, biz: e.business(), p: p} }

func (a *claimAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := a.runs.Add(1)
	ctx := r.Context()
	claim := a.e.claimFrom(ctx)
	req, _ := idemhttp.RequestFrom(ctx)
	if claim == nil {
		http.Error(w, "no claim", http.StatusInternalServerError)
		return
	}
	var in struct{ Amount int }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"amount","run":%d}`, run)
		return
	}
	ref, err := a.p.charge(ctx, claim.RelayKey())
	if a.panics != nil && a.panics(run) {
		panic("after the provider call")
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	tx := a.e.txFrom(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusServiceUnavailable)
		return
	}
	if _, err := tx.ExecContext(ctx, a.e.rebind("INSERT INTO "+a.biz+" (k, v) VALUES (?, ?)"), req.Key, ref); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"ref":%q,"run":%d}`, req.Key, ref, run)
}

// counting409 counts the 409 answers of h.
func counting409(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&statusSpy{ResponseWriter: w, n: n}, r)
	})
}

type statusSpy struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (s *statusSpy) WriteHeader(code int) {
	if code == http.StatusConflict {
		s.n.Add(1)
	}
	s.ResponseWriter.WriteHeader(code)
}

// In ModeClaim, duplicates of a request whose provider call is still
// running get 409 with Retry-After (no transaction waits on it); clients
// that retry converge on its replay, and the provider saw one call. The
// provider call ends only once every duplicate has had its 409.
func testHTTPClaimSlowProvider(t *testing.T) {
	const clients = 10
	forEach(t, func(t *testing.T, e *env) {
		p := newProvider()
		release := p.holdFirst(1)
		defer release()
		api := e.claimAPI(p)
		m, err := e.middleware(e.db, idemhttp.Config{Mode: idemserve.ModeClaim, Store: e.store(idem.WithLease(3 * time.Second)).Store, Scope: byCaller})
		must(t, err)
		var conflicts atomic.Int64
		srv := httptest.NewServer(counting409(m.Handler(api), &conflicts))
		t.Cleanup(srv.Close)
		url, body := srv.URL+"/v1/charges", `{"amount": 42}`

		firstc := make(chan response, 1)
		errc := make(chan error, 1)
		go func() {
			r, err := post(srv.Client(), url, body, "slow-1")
			firstc <- r
			errc <- err
		}()
		p.waitStarted(t)

		dup, err := post(srv.Client(), url, body, "slow-1")
		must(t, err)
		checkProblem(t, dup, http.StatusConflict, idemhttp.TypeInFlight, "retry after")
		checkRetryAfter(t, dup, 3*time.Second)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		wait := retryingClients(ctx, clients, srv.Client(), url, body, "slow-1", false)
		for conflicts.Load() < clients+1 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		release()
		responses := wait(t)
		first := <-firstc
		must(t, <-errc)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first request: %d replayed=%v %s", first.status, first.replayed(), first.body)
		}
		for _, r := range responses {
			if r.status != http.StatusCreated || !r.replayed() || string(r.body) != string(first.body) {
				t.Errorf("duplicate: %d replayed=%v %s; want the replay of %s", r.status, r.replayed(), r.body, first.body)
			}
		}
		if _, calls := p.only(t); calls != 1 || api.runs.Load() != 1 {
			t.Fatalf("the provider saw %d calls and the handler ran %d times; want 1 and 1", calls, api.runs.Load())
		}
		if n := e.count(api.biz, "slow-1"); n != 1 {
			t.Fatalf("%d charge rows, want 1", n)
		}
	})
}

// In ModeClaim a 5xx or a panic releases the claim, so the retry runs at
// once; the provider, called again with the same RelayKey, charges once.
// A 4xx answered before any Tx call is still stored.
func testHTTPClaimFailuresRelease(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, failure := range []string{"502", "panic"} {
			t.Run(failure, func(t *testing.T) {
				e := e.in(t)
				p := newProvider()
				api := e.claimAPI(p)
				if failure == "502" {
					p.fail = func(call int) bool { return call == 1 }
				} else {
					api.panics = func(run int64) bool { return run == 1 }
				}
				srv, s := e.serve(idemhttp.Config{Mode: idemserve.ModeClaim}, api)
				c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
				key := "claim-fail-" + failure
				r, err := post(c, srv.URL+"/v1/charges", `{"amount": 9}`, key)
				if failure == "panic" && err == nil || failure == "502" && (err != nil || r.status != 502) {
					t.Fatalf("first attempt: %d %s, %v", r.status, r.body, err)
				}
				if n := e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE idem_key = ? AND status = 'released'", key); n != 1 {
					t.Fatalf("%d released records, want 1", n)
				}
				r, err = post(c, srv.URL+"/v1/charges", `{"amount": 9}`, key)
				must(t, err)
				if r.status != 201 || r.replayed() {
					t.Fatalf("retry: %d replayed=%v %s; want a fresh 201 at once", r.status, r.replayed(), r.body)
				}
				if _, calls := p.only(t); calls != 2 {
					t.Fatalf("the provider saw %d calls, want 2 with one key", calls)
				}
				if n := e.count(api.biz, key); n != 1 {
					t.Fatalf("%d rows, want 1", n)
				}
			})
		}

		t.Run("4xx", func(t *testing.T) {
			e := e.in(t)
			api := e.claimAPI(newProvider())
			srv, _ := e.serve(idemhttp.Config{Mode: idemserve.ModeClaim}, api)
			for i := range 2 {
				r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 0}`, "claim-400")
				must(t, err)
				if r.status != 400 || r.replayed() != (i == 1) || string(r.body) != `{"error":"amount","run":1}` {
					t.Fatalf("request %d: %d replayed=%v %s", i, r.status, r.replayed(), r.body)
				}
			}
		})
	})
}

// A handler that runs past its lease (here in a provider call that ignores
// the deadline, Config.Timeout) is taken over by a retry; its own
// completion is then fenced out: it answers 409 (or 500, when its own
// statements fail past the deadline), its rows roll back, and the
// provider, called twice with one RelayKey, charged once.
func testHTTPClaimLeaseLost(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		p := newProvider()
		p.deaf = true
		release := p.holdFirst(2) // the first call ends once the second request is done
		defer release()
		api := e.claimAPI(p)
		srv, _ := e.serve(idemhttp.Config{Mode: idemserve.ModeClaim, Store: e.store(idem.WithLease(time.Second)).Store}, api)
		url, body := srv.URL+"/v1/charges", `{"amount": 5}`

		slowc := make(chan response, 1)
		errc := make(chan error, 1)
		go func() {
			r, err := post(srv.Client(), url, body, "lost-1")
			slowc <- r
			errc <- err
		}()
		p.waitStarted(t)
		time.Sleep(1500 * time.Millisecond) // past the 1s lease
		took, err := post(srv.Client(), url, body, "lost-1")
		must(t, err)
		if took.status != 201 || took.replayed() {
			t.Fatalf("takeover: %d replayed=%v %s", took.status, took.replayed(), took.body)
		}
		p.waitStarted(t)
		release()
		slow := <-slowc
		must(t, <-errc)
		// Past its deadline the handler's own statements may fail first
		// (on SQLite they do): then it answers 500 itself. Either way
		// nothing of it is stored.
		if slow.status != http.StatusInternalServerError {
			checkProblem(t, slow, http.StatusConflict, idemhttp.TypeInFlight, "took it over")
		}
		again, err := post(srv.Client(), url, body, "lost-1")
		must(t, err)
		if again.status != 201 || !again.replayed() || string(again.body) != string(took.body) {
			t.Fatalf("retry of the fenced-out request: %d replayed=%v %s; want the replay of %s", again.status, again.replayed(), again.body, took.body)
		}
		if _, calls := p.only(t); calls != 2 {
			t.Fatalf("the provider saw %d calls, want 2 with one key", calls)
		}
		if n := e.count(api.biz, "lost-1"); n != 1 {
			t.Fatalf("%d rows, want 1 (the fenced-out request's rolled back)", n)
		}
	})
}
