package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// impatientClient sends body with key once, then retries it five times,
// each attempt given clientTimeout and the retries spaced by pause: a
// client that gives up before the server is done, as a mobile client on a
// slow network does. It returns the answers it got; attempts that timed
// out or were told 409 have none.
func impatientClient(t *testing.T, url, body, key string, clientTimeout, pause time.Duration) (answers []response, timeouts int) {
	t.Helper()
	c := &http.Client{Timeout: clientTimeout}
	for attempt := range 6 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		r, err := post(c, url, body, key)
		switch {
		case err != nil:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("attempt %d: %v, want a client timeout", attempt+1, err)
			}
			timeouts++
		case r.status == http.StatusConflict:
		default:
			answers = append(answers, r)
		}
	}
	return answers, timeouts
}

// A client that gives up before the handler is done, then retries five
// times: the handler's work is not cancelled with the first request, it
// runs once and commits, and a retry gets its answer replayed. In both
// modes; in ModeClaim the provider call is not cancelled either.
func testHTTPClientGivesUp(t *testing.T) {
	const (
		handler       = time.Second
		clientTimeout = 300 * time.Millisecond
		pause         = 500 * time.Millisecond
	)
	forEach(t, func(t *testing.T, e *env) {
		t.Run("transaction", func(t *testing.T) {
			e := e.in(t)
			api := e.chargeAPI()
			api.delay = handler
			srv, _ := e.serve(idemhttp.Config{}, api)
			answers, timeouts := impatientClient(t, srv.URL+"/v1/charges", `{"amount": 12}`, "gave-up-1", clientTimeout, pause)
			checkGaveUp(t, answers, timeouts)
			if n, calls := e.count(api.biz, "gave-up-1"), api.calls.Load(); n != 1 || calls != 1 {
				t.Fatalf("%d charge rows, handler ran %d times; want 1 and 1", n, calls)
			}
		})
		t.Run("claim", func(t *testing.T) {
			e := e.in(t)
			p := newProvider()
			p.delay = handler
			api := e.claimAPI(p)
			srv, _ := e.serve(idemhttp.Config{Mode: idemserve.ModeClaim}, api)
			answers, timeouts := impatientClient(t, srv.URL+"/v1/charges", `{"amount": 12}`, "gave-up-2", clientTimeout, pause)
			checkGaveUp(t, answers, timeouts)
			if _, calls := p.only(t); calls != 1 || api.runs.Load() != 1 {
				t.Fatalf("the provider saw %d calls and the handler ran %d times; want 1 and 1", calls, api.runs.Load())
			}
			if n := e.count(api.biz, "gave-up-2"); n != 1 {
				t.Fatalf("%d charge rows, want 1", n)
			}
		})
	})
}

// checkGaveUp asserts that the first attempt timed out and that every
// answer a retry got is the replay of one 201.
func checkGaveUp(t *testing.T, answers []response, timeouts int) {
	t.Helper()
	if timeouts == 0 || len(answers) == 0 {
		t.Fatalf("%d timeouts and %d answers; want the first attempt to time out and a retry to get the replay", timeouts, len(answers))
	}
	for _, r := range answers {
		if r.status != http.StatusCreated || !r.replayed() || !bytes.Equal(r.body, answers[0].body) {
			t.Fatalf("a retry got %d replayed=%v %s; want the replay of the first run", r.status, r.replayed(), r.body)
		}
	}
}

// Duplicates of a slow request wait in the process, not on pooled
// connections: with a pool of 4 and 12 duplicates of a 1 s handler, the
// pool never runs out, and a request with another key is served without
// waiting for them (on SQLite, whose one writer is the slow request, it
// waits for the database's write lock, but not for a connection). The
// slow request runs once; every duplicate replays it.
func testHTTPDuplicatesWaitInMemory(t *testing.T) {
	const (
		dups = 12
		slow = time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		db := e.smallPool(4)
		biz := e.business()
		var runs atomic.Int64
		started := make(chan struct{}, 1)
		srv, _ := e.serveOn(db, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := idemhttp.RequestFrom(r.Context())
			if _, err := e.txFrom(r.Context()).ExecContext(r.Context(), e.rebind("INSERT INTO "+biz+" (k, v) VALUES (?, 'x')"), req.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			run := int64(0)
			if req.Key == "dup-slow" {
				run = runs.Add(1)
				select {
				case started <- struct{}{}:
				default:
				}
				time.Sleep(slow)
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "%s run %d", req.Key, run)
		}))
		url := srv.URL + "/v1/charges"

		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			responses []response
			errs      []error
		)
		for range dups {
			wg.Go(func() {
				r, err := post(srv.Client(), url, `{"amount": 1}`, "dup-slow")
				mu.Lock()
				defer mu.Unlock()
				responses, errs = append(responses, r), append(errs, err)
			})
		}
		done := make(chan struct{})
		go func() {
			wg.Wait()
			close(done)
		}()
		select {
		case <-started:
		case <-done: // the handler never ran: say what the server answered
			t.Fatalf("the slow handler never ran; answers: %v %s", errors.Join(errs...), responses[0].body)
		case <-time.After(30 * time.Second):
			t.Fatal("the slow handler did not start within 30s")
		}
		time.Sleep(300 * time.Millisecond) // the duplicates arrive and wait
		t0 := time.Now()
		other, err := post(srv.Client(), url, `{"amount": 1}`, "dup-other")
		elapsed := time.Since(t0)
		<-done
		must(t, err)
		must(t, errors.Join(errs...))

		if other.status != http.StatusCreated {
			t.Fatalf("the other key: %d %s", other.status, other.body)
		}
		if !e.embedded() && elapsed > slow/2 {
			t.Errorf("the other key took %v, want well under the slow handler's %v: it waited for a connection", elapsed, slow)
		}
		if w := db.waits(t); w != 0 {
			t.Errorf("%d requests waited for one of the pool's 4 connections; duplicates must wait in memory", w)
		}
		replays := 0
		for _, r := range responses {
			if r.status != http.StatusCreated || string(r.body) != "dup-slow run 1" {
				t.Errorf("duplicate: %d %s; want 201 dup-slow run 1", r.status, r.body)
			}
			if r.replayed() {
				replays++
			}
		}
		if n := e.count(biz, "dup-slow"); n != 1 || runs.Load() != 1 || replays != dups-1 {
			t.Fatalf("%d rows, %d runs, %d replays; want 1, 1 and %d", n, runs.Load(), replays, dups-1)
		}
	})
}

// Retry-After on a 409 says when a retry is likely to succeed: 1 s by
// default, Config.RetryAfter when set, never more than the lease left on
// the claim that holds the key.
func testHTTPRetryAfter(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		for _, c := range []struct {
			retryAfter time.Duration
			min, max   int
		}{
			{0, 1, 1},
			{3 * time.Second, 3, 3},
			{time.Hour, 1, 10},
		} {
			t.Run(fmt.Sprint(c.retryAfter), func(t *testing.T) {
				e := e.in(t)
				srv, s := e.serve(idemhttp.Config{RetryAfter: c.retryAfter}, e.chargeAPI())
				e.leaveClaim(e.onDriver(s), probe(t, e, s, "/v1/charges", `{"amount": 3}`, "ra-1"), 10*time.Second)
				r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 3}`, "ra-1")
				must(t, err)
				checkProblem(t, r, http.StatusConflict, idemhttp.TypeInFlight, "retry after")
				ra, err := strconv.Atoi(r.header.Get("Retry-After"))
				if err != nil || ra < c.min || ra > c.max {
					t.Fatalf("Retry-After %q with 10s left on the lease and RetryAfter %v; want %d to %d", r.header.Get("Retry-After"), c.retryAfter, c.min, c.max)
				}
			})
		}
	})
}

// One caller's key never reaches another caller's stored response: bob,
// sending alice's key with alice's body, runs his own request (no replay
// of alice's 201 and Location), and with another body is not told that
// alice's key exists. With SingleTenant, the opt-out, he gets alice's
// replay: what that value costs.
func testHTTPScopeIsolatesCallers(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		srv, _ := e.serve(idemhttp.Config{}, api)
		url, c := srv.URL+"/v1/charges", srv.Client()
		alice, err := postAs(c, "alice", url, `{"amount": 70}`, "leaked-1")
		must(t, err)
		bob, err := postAs(c, "bob", url, `{"amount": 70}`, "leaked-1")
		must(t, err)
		if alice.status != http.StatusCreated || bob.status != http.StatusCreated || bob.replayed() || bytes.Equal(alice.body, bob.body) {
			t.Fatalf("alice %d %s, bob %d replayed=%v %s; want bob's own fresh 201", alice.status, alice.body, bob.status, bob.replayed(), bob.body)
		}
		other, err := postAs(c, "carol", url, `{"amount": 1}`, "leaked-1")
		must(t, err)
		if other.status != http.StatusCreated || other.replayed() {
			t.Fatalf("carol, alice's key with another body: %d %s; want her own fresh 201, not a 422", other.status, other.body)
		}
		anonymous, err := postAs(c, "", url, `{"amount": 70}`, "leaked-1")
		must(t, err)
		checkProblem(t, anonymous, http.StatusUnauthorized, "about:blank", "name the caller")
		if n := e.count(api.biz, "leaked-1"); n != 3 || api.calls.Load() != 3 {
			t.Fatalf("%d rows, %d runs; want 3 and 3, one per caller", n, api.calls.Load())
		}

		shared := e.chargeAPI()
		single, _ := e.serve(idemhttp.Config{Scope: idemhttp.SingleTenant}, shared)
		alice, err = postAs(c, "alice", single.URL+"/v1/charges", `{"amount": 70}`, "leaked-2")
		must(t, err)
		bob, err = postAs(c, "bob", single.URL+"/v1/charges", `{"amount": 70}`, "leaked-2")
		must(t, err)
		if !bob.replayed() || !bytes.Equal(alice.body, bob.body) || bob.header.Get("Location") != alice.header.Get("Location") {
			t.Fatalf("SingleTenant: bob got %d replayed=%v %s; want alice's replay", bob.status, bob.replayed(), bob.body)
		}
	})
}

// Config.Timeout bounds a request that holds its key: the handler's
// context ends after it, and a duplicate waiting in memory gives up after
// it with a 409. Nothing is stored, so a retry runs again.
func testHTTPTimeout(t *testing.T) {
	const timeout = 500 * time.Millisecond
	forEach(t, func(t *testing.T, e *env) {
		biz := e.business()
		handlerErr := make(chan error, 1)
		started := make(chan struct{})
		srv, s := e.serve(idemhttp.Config{Timeout: timeout}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := idemhttp.RequestFrom(r.Context())
			if _, err := e.txFrom(r.Context()).ExecContext(r.Context(), e.rebind("INSERT INTO "+biz+" (k, v) VALUES (?, 'x')"), req.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			close(started)
			time.Sleep(3 * timeout) // past the deadline, ignoring it
			handlerErr <- r.Context().Err()
			w.WriteHeader(http.StatusCreated)
		}))
		url := srv.URL + "/v1/charges"
		firstc := make(chan error, 1)
		go func() {
			_, err := post(srv.Client(), url, `{"amount": 1}`, "timeout-1")
			firstc <- err
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start within 30s")
		}
		dup, err := post(srv.Client(), url, `{"amount": 1}`, "timeout-1")
		must(t, err)
		checkProblem(t, dup, http.StatusConflict, idemhttp.TypeInFlight, "retry after")
		if ra := dup.header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if err := <-handlerErr; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the handler's context after the timeout: %v, want context.DeadlineExceeded", err)
		}
		must(t, <-firstc)
		if n, rec := e.count(biz, "timeout-1"), e.records(s, "timeout-1"); n != 0 || rec != 0 {
			t.Fatalf("%d rows, %d records; want nothing stored past the deadline", n, rec)
		}
	})
}

// With idem.WithLockTimeout on the Store, a duplicate of a request that
// is still running gets one answer whichever instance it reaches: from
// the instance running the request, where it waits in memory, as from
// another one (a second Store on the same table, as another process
// has), where it waits on the row lock, it is a 409 with the Retry-After
// of the bound (min of Config.RetryAfter and the bound rounded up to a
// second: 1 here), after the bound, not the first request's answer once
// that one is done. Once the first has committed, both replay it.
func testHTTPLockTimeoutBoundsEveryWait(t *testing.T) {
	const (
		bound = 500 * time.Millisecond
		slow  = 2 * time.Second // past the bound as MySQL applies it, in whole seconds
	)
	forEach(t, func(t *testing.T, e *env) {
		if !e.BoundsLockWaits {
			t.Skipf("%s has no WithLockTimeout (TestLockTimeout)", e.Name)
		}
		biz := e.business()
		var runs atomic.Int64
		started := make(chan struct{}, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := idemhttp.RequestFrom(r.Context())
			if _, err := e.txFrom(r.Context()).ExecContext(r.Context(), e.rebind("INSERT INTO "+biz+" (k, v) VALUES (?, 'x')"), req.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			n := runs.Add(1)
			started <- struct{}{}
			time.Sleep(slow)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", n)
		})
		s := e.store(idem.WithLockTimeout(bound))
		here, _ := e.serve(idemhttp.Config{Store: s.Store, RetryAfter: 3 * time.Second}, h)
		there, _ := e.serve(idemhttp.Config{Store: e.elsewhere(s, idem.WithLockTimeout(bound)).Store, RetryAfter: 3 * time.Second}, h)
		path, body := "/v1/charges", `{"amount": 1}`

		firstc := make(chan response, 1)
		errc := make(chan error, 1)
		go func() {
			r, err := post(here.Client(), here.URL+path, body, "bounded-1")
			firstc <- r
			errc <- err
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start within 30s")
		}
		var (
			wg   sync.WaitGroup
			dups [2]response
			errs [2]error
		)
		for i, srv := range []string{here.URL, there.URL} {
			wg.Go(func() { dups[i], errs[i] = post(here.Client(), srv+path, body, "bounded-1") })
		}
		wg.Wait()
		first := <-firstc
		must(t, <-errc)
		for i, where := range []string{"on the same instance", "on another instance"} {
			must(t, errs[i])
			if dups[i].status != http.StatusConflict || dups[i].header.Get("Retry-After") != "1" {
				t.Errorf("the duplicate %s: %d Retry-After %q %s; want 409 with Retry-After 1 after the %v bound", where, dups[i].status, dups[i].header.Get("Retry-After"), dups[i].body, bound)
				continue
			}
			checkProblem(t, dups[i], http.StatusConflict, idemhttp.TypeInFlight, "retry after")
		}
		if first.status != http.StatusCreated || string(first.body) != "run 1" {
			t.Fatalf("the first request: %d %s", first.status, first.body)
		}
		for _, srv := range []string{here.URL, there.URL} {
			r, err := post(here.Client(), srv+path, body, "bounded-1")
			must(t, err)
			if r.status != http.StatusCreated || !r.replayed() || string(r.body) != "run 1" {
				t.Errorf("a retry once the first committed: %d replayed=%v %s; want the replay of run 1", r.status, r.replayed(), r.body)
			}
		}
		if n := e.count(biz, "bounded-1"); n != 1 || runs.Load() != 1 {
			t.Fatalf("%d rows, %d runs; want 1 and 1", n, runs.Load())
		}
	})
}

// A retry its client numbers (Idempotency-Attempt above 1) reads its
// key's record before it claims the key, at an instance that has not
// served the key too. Seen on PostgreSQL, whose plain read waits for no
// row lock: while a transaction holds the completed record deleted but
// not committed, a numbered retry replays at once, where one without the
// number waits for that transaction in its claim, to learn whether the
// key is free, and replays once it rolls back.
func testHTTPRetryNumberReadsFirst(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		api := e.chargeAPI()
		first, s := e.serve(idemhttp.Config{}, api)
		if r, err := post(http.DefaultClient, first.URL+"/v1/charges", `{"amount": 5}`, "numbered"); err != nil || r.status != http.StatusCreated {
			t.Fatalf("first request: %+v, %v", r, err)
		}
		instance := func() string {
			other, err := idem.New(e.Dialect, idem.WithTable(s.Table()))
			must(t, err)
			srv, _ := e.serve(idemhttp.Config{Store: other}, api)
			return srv.URL + "/v1/charges"
		}
		retry := func(url, attempt string) (response, error) {
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount": 5}`))
			if err != nil {
				return response{}, err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(callerHeader, "alice")
			req.Header.Set(idemhttp.HeaderIdempotencyKey, "numbered")
			if attempt != "" {
				req.Header.Set(idemhttp.HeaderAttempt, attempt)
			}
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				return response{}, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return response{status: resp.StatusCode, header: resp.Header, body: b}, err
		}
		holder := e.begin(nil)
		if _, err := holder.Exec(e.rebind("DELETE FROM "+s.Table()+" WHERE idem_key = ?"), "numbered"); err != nil {
			t.Fatal(err)
		}
		if r, err := retry(instance(), "2"); err != nil || r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("a numbered retry beside the held record: %+v, %v; want the replay at once", r, err)
		}
		unnumbered := make(chan error, 1)
		go func() {
			r, err := retry(instance(), "")
			if err == nil && (r.status != http.StatusCreated || !r.replayed()) {
				err = fmt.Errorf("%d %s, want the replay", r.status, r.body)
			}
			unnumbered <- err
		}()
		select {
		case err := <-unnumbered:
			t.Fatalf("a retry without a number answered beside the held record (%v): it did not claim first", err)
		case <-time.After(300 * time.Millisecond):
		}
		must(t, holder.Rollback())
		must(t, <-unnumbered)
		if n, calls := e.count(api.biz, "numbered"), api.calls.Load(); n != 1 || calls != 1 {
			t.Fatalf("%d charge rows, the handler ran %d times; want 1 and 1", n, calls)
		}
	})
}
