package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// attempt is what the server saw of one attempt.
type attempt struct {
	keys    []string // the Idempotency-Key field lines
	numbers []string // the Idempotency-Attempt field lines
	body    string
	at      time.Time
	err     error // reading the body
}

// server is a test server whose handler answers attempt n (0, 1, ...) as
// answer says, and which records every attempt.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	attempts []attempt
}

// newServer starts a server. answer writes the answer to attempt n, or
// hijacks the connection and closes it.
func newServer(t *testing.T, answer func(w http.ResponseWriter, n int)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.attempts)
		s.attempts = append(s.attempts, attempt{keys: r.Header.Values(HeaderIdempotencyKey), numbers: r.Header.Values(HeaderAttempt),
			body: string(b), at: time.Now(), err: err})
		s.mu.Unlock()
		answer(w, n)
	}))
	t.Cleanup(s.Close)
	return s
}

// seen returns the attempts so far, failing the test if a body could not
// be read.
func (s *server) seen(t *testing.T) []attempt {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range s.attempts {
		if a.err != nil {
			t.Fatalf("attempt %d: reading the body: %v", i, a.err)
		}
	}
	return append([]attempt(nil), s.attempts...)
}

// statuses answers attempt n with codes[n], and the last code after them.
func statuses(codes ...int) func(http.ResponseWriter, int) {
	return func(w http.ResponseWriter, n int) {
		code := codes[min(n, len(codes)-1)]
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer %d", n)
	}
}

// fast is a Transport with waits too short to slow a test down.
func fast(base http.RoundTripper) *Transport {
	return &Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, MaxRetryAfter: 50 * time.Millisecond}
}

func do(t *testing.T, rt http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

var sfUUID = regexp.MustCompile(`^"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"$`)

func TestKeyAddedAndKeptAcrossAttempts(t *testing.T) {
	srv := newServer(t, statuses(503, 500, 201))
	req := post(t, srv.URL, "{}")
	resp, body := do(t, fast(srv.Client().Transport), req)
	if resp.StatusCode != 201 || body != "answer 2" {
		t.Fatalf("got %d %q, want 201 from the third attempt", resp.StatusCode, body)
	}
	seen := srv.seen(t)
	if len(seen) != 3 {
		t.Fatalf("%d attempts, want 3", len(seen))
	}
	first := seen[0].keys
	if len(first) != 1 || !sfUUID.MatchString(first[0]) {
		t.Fatalf("key field %q, want one sf-string holding a UUIDv4", first)
	}
	for i, a := range seen {
		if len(a.keys) != 1 || a.keys[0] != first[0] {
			t.Fatalf("attempt %d sent key %q, the first sent %q", i, a.keys, first)
		}
	}
	if got := Key(resp); `"`+got+`"` != first[0] {
		t.Fatalf("Key(resp) = %q, the server saw %s", got, first[0])
	}
	if v := req.Header.Values(HeaderIdempotencyKey); v != nil {
		t.Fatalf("the caller's request was changed: it has key %q", v)
	}
}

// The first attempt goes as the caller made it; each retry carries its
// number, so that the server can read the stored response first.
func TestRetriesNumbered(t *testing.T) {
	srv := newServer(t, statuses(503, 409, 201))
	req := post(t, srv.URL, "{}")
	req.Header.Set(HeaderAttempt, "7") // the caller's own is replaced on retries
	if resp, _ := do(t, fast(srv.Client().Transport), req); resp.StatusCode != 201 {
		t.Fatalf("got %d, want 201 from the third attempt", resp.StatusCode)
	}
	seen := srv.seen(t)
	for i, want := range [][]string{{"7"}, {"2"}, {"3"}} {
		if got := seen[i].numbers; strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("attempt %d: %s %q, want %q", i+1, HeaderAttempt, got, want)
		}
	}
	if v := req.Header.Values(HeaderAttempt); len(v) != 1 || v[0] != "7" {
		t.Fatalf("the caller's request was changed: %s %q", HeaderAttempt, v)
	}
	srv = newServer(t, statuses(201))
	do(t, fast(srv.Client().Transport), post(t, srv.URL, "{}"))
	if got := srv.seen(t)[0].numbers; got != nil {
		t.Fatalf("a first attempt carried %s %q", HeaderAttempt, got)
	}
}

func TestKeysDifferPerRequest(t *testing.T) {
	srv := newServer(t, statuses(201))
	tr := &Transport{Base: srv.Client().Transport}
	const n = 20
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		keys = map[string]bool{}
		errs []error
	)
	for range n {
		req := post(t, srv.URL, "x")
		wg.Go(func() {
			resp, err := tr.RoundTrip(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			resp.Body.Close()
			keys[Key(resp)] = true
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(keys) != n || keys[""] {
		t.Fatalf("%d requests got %d distinct keys: %v", n, len(keys), keys)
	}
}

func TestExistingKeyKept(t *testing.T) {
	for _, key := range []string{"order-1", `"order-2"`, `"a\"b"`} {
		t.Run(key, func(t *testing.T) {
			srv := newServer(t, statuses(409, 200))
			req := post(t, srv.URL, "{}")
			req.Header.Set(HeaderIdempotencyKey, key)
			resp, _ := do(t, fast(srv.Client().Transport), req)
			seen := srv.seen(t)
			if resp.StatusCode != 200 || len(seen) != 2 {
				t.Fatalf("got %d after %d attempts, want 200 after 2", resp.StatusCode, len(seen))
			}
			for i, a := range seen {
				if len(a.keys) != 1 || a.keys[0] != key {
					t.Fatalf("attempt %d sent %q, want the caller's %q", i, a.keys, key)
				}
			}
			want := strings.NewReplacer(`\"`, `"`).Replace(strings.Trim(key, `"`))
			if got := Key(resp); got != want {
				t.Fatalf("Key(resp) = %q, want %q", got, want)
			}
		})
	}
}

// closeCounter is a request body without GetBody that counts its Close
// calls.
type closeCounter struct {
	io.Reader
	mu     sync.Mutex
	closed int
}

func (c *closeCounter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed++
	return nil
}

func TestBodyResentWhole(t *testing.T) {
	payload := strings.Repeat(`{"amount": 1999, "currency": "EUR"}`, 500)
	for name, body := range map[string]func() io.Reader{
		"GetBody": func() io.Reader { return strings.NewReader(payload) },
		"no GetBody": func() io.Reader {
			return io.MultiReader(strings.NewReader(payload[:7]), strings.NewReader(payload[7:]))
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t, statuses(500, 502, 429, 201))
			orig := &closeCounter{Reader: body()}
			req, err := http.NewRequest(http.MethodPost, srv.URL, orig)
			if err != nil {
				t.Fatal(err)
			}
			if name == "GetBody" {
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body()), nil }
			}
			resp, _ := do(t, fast(srv.Client().Transport), req)
			seen := srv.seen(t)
			if resp.StatusCode != 201 || len(seen) != 4 {
				t.Fatalf("got %d after %d attempts, want 201 after 4", resp.StatusCode, len(seen))
			}
			for i, a := range seen {
				if a.body != payload {
					t.Fatalf("attempt %d sent %d bytes, want the %d of the body", i, len(a.body), len(payload))
				}
			}
			orig.mu.Lock()
			defer orig.mu.Unlock()
			if orig.closed == 0 {
				t.Fatal("the request's body was not closed")
			}
		})
	}
}

func TestBodyOverMaxBodySentOnce(t *testing.T) {
	srv := newServer(t, statuses(503, 201))
	tr := fast(srv.Client().Transport)
	tr.MaxBody = 8
	orig := &closeCounter{Reader: io.MultiReader(strings.NewReader("0123456789"), strings.NewReader("abcdefghij"))}
	req, err := http.NewRequest(http.MethodPost, srv.URL, orig)
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := do(t, tr, req)
	seen := srv.seen(t)
	if resp.StatusCode != 503 || len(seen) != 1 || seen[0].body != "0123456789abcdefghij" || len(seen[0].keys) != 1 {
		t.Fatalf("got %d after %d attempts (%+v), want the 503 of one attempt with the whole body and a key", resp.StatusCode, len(seen), seen)
	}
	orig.mu.Lock()
	defer orig.mu.Unlock()
	if orig.closed == 0 {
		t.Fatal("the request's body was not closed")
	}
}

func TestRetriedStatuses(t *testing.T) {
	for _, code := range []int{500, 502, 503, 504, 409, 429} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := newServer(t, statuses(code, 201))
			resp, body := do(t, fast(srv.Client().Transport), post(t, srv.URL, "{}"))
			if n := len(srv.seen(t)); resp.StatusCode != 201 || body != "answer 1" || n != 2 {
				t.Fatalf("got %d %q after %d attempts, want 201 after 2", resp.StatusCode, body, n)
			}
		})
	}
}

func TestFinalStatusesNotRetried(t *testing.T) {
	for _, code := range []int{200, 201, 204, 302, 400, 401, 402, 403, 404, 410, 413, 422, 501} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := newServer(t, statuses(code, 201))
			resp, _ := do(t, fast(srv.Client().Transport), post(t, srv.URL, "{}"))
			if n := len(srv.seen(t)); resp.StatusCode != code || n != 1 {
				t.Fatalf("got %d after %d attempts, want %d after 1", resp.StatusCode, n, code)
			}
		})
	}
}

// hangUp hijacks the connection of attempt 0 and closes it without an
// answer, as a crashed server or a broken network would; later attempts
// get a 201.
func hangUp(w http.ResponseWriter, n int) {
	if n == 0 {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	w.WriteHeader(201)
}

func TestNetworkErrorRetried(t *testing.T) {
	srv := newServer(t, hangUp)
	resp, _ := do(t, fast(srv.Client().Transport), post(t, srv.URL, "body"))
	seen := srv.seen(t)
	if resp.StatusCode != 201 || len(seen) != 2 {
		t.Fatalf("got %d after %d attempts, want 201 after 2", resp.StatusCode, len(seen))
	}
	if seen[1].body != "body" || len(seen[1].keys) != 1 || seen[1].keys[0] != seen[0].keys[0] {
		t.Fatalf("the retry sent %+v, the first attempt %+v", seen[1], seen[0])
	}
}

func TestNetworkErrorsBounded(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { hangUp(w, 0) })
	tr := fast(srv.Client().Transport)
	tr.MaxAttempts = 3
	resp, err := tr.RoundTrip(post(t, srv.URL, "body"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want an error", resp.StatusCode)
	}
	if n := len(srv.seen(t)); n != 3 || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("%d attempts, error %v; want 3 attempts", n, err)
	}
}

func TestAttemptsBounded(t *testing.T) {
	srv := newServer(t, statuses(503))
	for _, limit := range []int{0, 1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			before := len(srv.seen(t))
			tr := fast(srv.Client().Transport)
			tr.MaxAttempts = limit
			resp, body := do(t, tr, post(t, srv.URL, "{}"))
			want := limit
			if limit == 0 {
				want = DefaultMaxAttempts
			}
			n := len(srv.seen(t)) - before
			// The last answer is returned as it is, body included.
			if resp.StatusCode != 503 || n != want || body != fmt.Sprintf("answer %d", before+want-1) {
				t.Fatalf("got %d %q after %d attempts, want the last 503 after %d", resp.StatusCode, body, n, want)
			}
		})
	}
}

func TestNoKeyNoRetry(t *testing.T) {
	for _, method := range []string{"GET", "HEAD", "OPTIONS", "TRACE", "POST without key"} {
		t.Run(method, func(t *testing.T) {
			srv := newServer(t, statuses(503, 200))
			tr := fast(srv.Client().Transport)
			if method == "POST without key" {
				method, tr.NoAutoKey = "POST", true
			}
			req, err := http.NewRequest(method, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, _ := do(t, tr, req)
			seen := srv.seen(t)
			if resp.StatusCode != 503 || len(seen) != 1 || seen[0].keys != nil {
				t.Fatalf("got %d after %+v, want the 503 of one attempt without a key", resp.StatusCode, seen)
			}
		})
	}
}

func TestUnsafeMethodsGetKey(t *testing.T) {
	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE", "CHARGE"} {
		t.Run(method, func(t *testing.T) {
			srv := newServer(t, statuses(503, 200))
			req, err := http.NewRequest(method, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, _ := do(t, fast(srv.Client().Transport), req)
			seen := srv.seen(t)
			if resp.StatusCode != 200 || len(seen) != 2 || len(seen[1].keys) != 1 || !sfUUID.MatchString(seen[1].keys[0]) {
				t.Fatalf("got %d after %+v, want 200 after two attempts with a key", resp.StatusCode, seen)
			}
		})
	}
}

func TestSafeMethodWithKeyRetried(t *testing.T) {
	srv := newServer(t, statuses(503, 200))
	req, err := http.NewRequest("GET", srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(HeaderIdempotencyKey, `"k"`)
	resp, _ := do(t, fast(srv.Client().Transport), req)
	if n := len(srv.seen(t)); resp.StatusCode != 200 || n != 2 {
		t.Fatalf("got %d after %d attempts, want 200 after 2", resp.StatusCode, n)
	}
}

// retryAfterThen answers attempt 0 with code and Retry-After: v, and later
// attempts with 201.
func retryAfterThen(code int, v string) func(http.ResponseWriter, int) {
	return func(w http.ResponseWriter, n int) {
		if n == 0 {
			w.Header().Set("Retry-After", v)
			w.WriteHeader(code)
			return
		}
		w.WriteHeader(201)
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Run("capped", func(t *testing.T) {
		// The server asks for 1s; MaxRetryAfter cuts it to 150ms, far
		// above the backoff of at most 1ms.
		srv := newServer(t, retryAfterThen(429, "1"))
		tr := &Transport{Base: srv.Client().Transport, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxRetryAfter: 150 * time.Millisecond}
		resp, _ := do(t, tr, post(t, srv.URL, "{}"))
		seen := srv.seen(t)
		if resp.StatusCode != 201 || len(seen) != 2 {
			t.Fatalf("got %d after %d attempts, want 201 after 2", resp.StatusCode, len(seen))
		}
		if gap := seen[1].at.Sub(seen[0].at); gap < 150*time.Millisecond || gap > 900*time.Millisecond {
			t.Fatalf("retried after %v, want 150ms (Retry-After: 1, capped)", gap)
		}
	})
	t.Run("replaces the backoff", func(t *testing.T) {
		// Retry-After: 0 says to retry at once. A backoff of up to an hour
		// would instead pass the context's deadline, and the 503 would be
		// returned.
		srv := newServer(t, retryAfterThen(503, "0"))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr := &Transport{Base: srv.Client().Transport, BaseDelay: time.Hour, MaxDelay: time.Hour, MaxElapsed: 2 * time.Hour}
		resp, _ := do(t, tr, post(t, srv.URL, "{}").WithContext(ctx))
		if n := len(srv.seen(t)); resp.StatusCode != 201 || n != 2 {
			t.Fatalf("got %d after %d attempts, want 201 after 2", resp.StatusCode, n)
		}
	})
	t.Run("beyond MaxElapsed", func(t *testing.T) {
		srv := newServer(t, retryAfterThen(503, "5"))
		tr := &Transport{Base: srv.Client().Transport, MaxElapsed: time.Second}
		start := time.Now()
		resp, _ := do(t, tr, post(t, srv.URL, "{}"))
		if n := len(srv.seen(t)); resp.StatusCode != 503 || n != 1 || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("got %d after %d attempts and %v, want the 503 at once", resp.StatusCode, n, time.Since(start))
		}
	})
	t.Run("beyond the context's deadline", func(t *testing.T) {
		srv := newServer(t, retryAfterThen(503, "5"))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req := post(t, srv.URL, "{}").WithContext(ctx)
		start := time.Now()
		resp, _ := do(t, &Transport{Base: srv.Client().Transport}, req)
		if n := len(srv.seen(t)); resp.StatusCode != 503 || n != 1 || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("got %d after %d attempts and %v, want the 503 at once", resp.StatusCode, n, time.Since(start))
		}
	})
}

func TestRetryAfterParsed(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"0":                             0,
		"3":                             3 * time.Second,
		" 120 ":                         2 * time.Minute,
		"Mon, 30 Nov 2026 12:00:07 GMT": 7 * time.Second,
		"Mon, 30 Nov 2026 11:00:00 GMT": 0,
		"-1":                            -1,
		"1.5":                           -1,
		"soon":                          -1,
		"":                              -1,
	} {
		got, ok := retryAfter(http.Header{"Retry-After": {v}}, now)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("Retry-After: %q gives %v, want %v (-1: none)", v, got, want)
		}
	}
}

func TestBackoffFullJitter(t *testing.T) {
	tr := &Transport{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}
	for n, ceiling := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 3: 40 * time.Millisecond, 4: 50 * time.Millisecond, 60: 50 * time.Millisecond} {
		lo, hi := ceiling, time.Duration(0)
		for range 2000 {
			d := tr.backoff(n)
			lo, hi = min(lo, d), max(hi, d)
		}
		// Uniform over [0, ceiling]: 2000 draws come within 5% of both ends.
		if lo < 0 || hi > ceiling || lo > ceiling/20 || hi < ceiling*19/20 {
			t.Errorf("retry %d: waits in [%v, %v], want spread over [0, %v]", n, lo, hi, ceiling)
		}
	}
	if d := new(Transport).backoff(1); d > DefaultBaseDelay {
		t.Errorf("zero Transport: first wait %v, over DefaultBaseDelay", d)
	}
}

func TestContextCancelStops(t *testing.T) {
	srv := newServer(t, retryAfterThen(503, "5"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := post(t, srv.URL, "{}").WithContext(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	resp, err := (&Transport{Base: srv.Client().Transport}).RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.Canceled) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("got %v after %v, want context.Canceled soon after 50ms", err, time.Since(start))
	}
	if n := len(srv.seen(t)); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

func TestCanceledContextNotRetried(t *testing.T) {
	// The server answers after the context is canceled: the network error
	// that follows must not be retried.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		cancel()
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(201)
	})
	resp, err := fast(srv.Client().Transport).RoundTrip(post(t, srv.URL, "{}").WithContext(ctx))
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if n := len(srv.seen(t)); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

func TestZeroTransport(t *testing.T) {
	// The zero value, on http.DefaultTransport, with its default backoff.
	srv := newServer(t, statuses(503, 201))
	client := &http.Client{Transport: &Transport{}}
	resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	seen := srv.seen(t)
	if resp.StatusCode != 201 || len(seen) != 2 || seen[0].keys[0] != seen[1].keys[0] || `"`+Key(resp)+`"` != seen[1].keys[0] {
		t.Fatalf("got %d, key %q, after %+v", resp.StatusCode, Key(resp), seen)
	}
}

func TestKey(t *testing.T) {
	for v, want := range map[string]string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"a\"b\\c"`:                              `a"b\c`,
		"bare-token":                             "bare-token",
		"":                                       "",
	} {
		resp := &http.Response{Request: &http.Request{Header: http.Header{}}}
		if v != "" {
			resp.Request.Header.Set(HeaderIdempotencyKey, v)
		}
		if got := Key(resp); got != want {
			t.Errorf("Key with field %q = %q, want %q", v, got, want)
		}
	}
	if Key(nil) != "" || Key(&http.Response{}) != "" {
		t.Error("Key of a response without a request is not empty")
	}
}
