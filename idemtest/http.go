package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
	"github.com/idemkit/idem/idemtest/testdb"
)

// PaymentsApp is one service of the payments checks that RunHTTP makes
// for a router: a database with a charges table, a Store, and idemhttp's
// middleware on them, which the router's test puts in front of its
// payments handler, written in the router's own idiom. The handler
// decodes a [ChargeInput], calls [PaymentsApp.Provider] (the slow part:
// in ModeClaim no transaction is open yet), records the charge with
// [PaymentsApp.Record] through idemhttp.TxFrom of the request's context,
// and answers 201 with the [Charge] as JSON and a Location of
// /v1/charges/{id}; 400 for a body it cannot decode, 502 when Provider
// fails and 500 when Record does.
type PaymentsApp struct {
	// Middleware is the middleware for POST /v1/charges. Its Scope is the
	// caller named in the X-Account header.
	Middleware *idemhttp.Middleware
	// Mode is the middleware's mode.
	Mode idemserve.Mode

	db       *sql.DB
	dialect  idem.Dialect
	charges  string
	provider *httpProvider
}

// ChargeInput is the body of POST /v1/charges.
type ChargeInput struct {
	Amount int64 `json:"amount"`
}

// Charge is a recorded charge, the body of the handler's 201.
type Charge struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Ref    string `json:"ref"` // the provider's reference
}

// httpLockTimeout is the Store's idem.WithLockTimeout in RunHTTP: in
// ModeTransaction a duplicate waits this long for the request ahead of it,
// then is a 409.
const httpLockTimeout = 300 * time.Millisecond

// RunHTTP runs the payments checks against the service that build
// returns (a router serving app's payments handler at POST /v1/charges
// behind app.Middleware), on PostgreSQL and MariaDB through database/sql,
// in ModeTransaction and in ModeClaim, each as a subtest of t:
//
//   - the handler's rows go through the middleware's transaction: a
//     charge commits one row, and a 500 after the row rolls it back;
//   - a retry replays the stored answer (Idempotent-Replayed: true, the
//     same status, body and Location) without running the handler;
//   - the key reused with another body is a 422 problem;
//   - a duplicate that arrives while another request holds the key is a
//     409 problem with Retry-After (at once in ModeClaim, after the
//     Store's lock timeout of 300 ms in ModeTransaction), and replays once
//     it is done;
//   - a client that gives up mid-request: the work still commits, once,
//     and the client's retry replays it.
func RunHTTP(t *testing.T, build func(app *PaymentsApp) http.Handler) {
	t.Helper()
	for _, db := range []struct {
		name    string
		server  *testdb.Server
		dialect idem.Dialect
	}{
		{"postgres", testdb.Postgres, idem.Postgres},
		{"mariadb", testdb.MariaDB, idem.MariaDB},
	} {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			name := db.name + "/transaction"
			if mode == idemserve.ModeClaim {
				name = db.name + "/claim"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				app := newPaymentsApp(t, db.server, db.dialect, mode, nil)
				srv := httptest.NewServer(build(app))
				t.Cleanup(srv.Close)
				c := &httpClient{url: srv.URL + "/v1/charges", client: srv.Client()}
				t.Run("RowsInTheTransaction", func(t *testing.T) { httpRows(t, app, c) })
				t.Run("Replay", func(t *testing.T) { httpReplay(t, app, c) })
				t.Run("ReusedKey", func(t *testing.T) { httpReusedKey(t, app, c) })
				t.Run("InFlight", func(t *testing.T) { httpInFlight(t, app, c) })
				t.Run("ClientGivesUp", func(t *testing.T) { httpClientGivesUp(t, app, c) })
			})
		}
	}
}

func newPaymentsApp(t *testing.T, server *testdb.Server, dialect idem.Dialect, mode idemserve.Mode, opts *sql.TxOptions) *PaymentsApp {
	t.Helper()
	db, err := sql.Open(server.Driver, server.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	suffix := strings.ToLower(rand.Text()[:10])
	table, charges := "idem_http_"+suffix, "charges_"+suffix
	store, err := idem.New(dialect, idem.WithTable(table), idem.WithLockTimeout(httpLockTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+charges+" (id VARCHAR(40) PRIMARY KEY, k VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, ref VARCHAR(255) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{charges, table} {
			if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name); err != nil {
				t.Errorf("drop %s: %v", name, err)
			}
		}
	})
	mw, err := idemhttp.New(idemhttp.Config{
		Store: store, DB: db, TxOptions: opts, Mode: mode, Required: true,
		Scope: func(r *http.Request) (string, error) {
			if a := r.Header.Get("X-Account"); a != "" {
				return a, nil
			}
			return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "name the account in X-Account"}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &PaymentsApp{Middleware: mw, Mode: mode, db: db, dialect: dialect, charges: charges, provider: newHTTPProvider()}
}

// Provider charges the card at the checks' stand-in for a payment
// provider, which, like a real one, charges once per idempotency key (the
// claim's RelayKey in ModeClaim, the request's key otherwise) and returns
// the charge's reference. It takes as long as the running check needs; a
// handler calls it before it takes its transaction.
func (a *PaymentsApp) Provider(ctx context.Context) (ref string, err error) {
	req, ok := idemhttp.RequestFrom(ctx)
	if !ok {
		return "", errors.New("idemtest: the request has no Idempotency-Key in its context: is the handler behind the middleware, with the request's context?")
	}
	relay := req.Key
	if c := idemhttp.ClaimFrom(ctx); c != nil {
		relay = c.RelayKey()
	}
	return a.provider.charge(ctx, req.Key, relay)
}

// errHTTPRecord is Record's error for a key whose first record a check
// makes fail.
var errHTTPRecord = errors.New("idemtest: the check makes this record fail after its row was written")

// Record writes the charge of amount, with the provider's ref, as a row
// of the charges table through tx, the handler's transaction
// (idemhttp.TxFrom), and returns it.
func (a *PaymentsApp) Record(ctx context.Context, tx *sql.Tx, amount int64, ref string) (Charge, error) {
	if tx == nil {
		return Charge{}, errors.New("idemtest: no transaction (idemhttp.TxFrom returned nil): is the handler behind the middleware, with the request's context?")
	}
	req, _ := idemhttp.RequestFrom(ctx)
	skewed := a.provider.skewed(req.Key)
	if skewed {
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+a.charges).Scan(&n); err != nil {
			return Charge{}, err
		}
	}
	ch := Charge{ID: "ch_" + strings.ToLower(rand.Text()[:16]), Amount: amount, Ref: ref}
	q := "INSERT INTO " + a.charges + " (id, k, amount, ref) VALUES (?, ?, ?, ?)"
	if a.dialect == idem.Postgres {
		q = "INSERT INTO " + a.charges + " (id, k, amount, ref) VALUES ($1, $2, $3, $4)"
	}
	if _, err := tx.ExecContext(ctx, q, ch.ID, req.Key, ch.Amount, ch.Ref); err != nil {
		return Charge{}, err
	}
	if skewed {
		a.provider.arrive(ctx)
	}
	if a.provider.failRecord(req.Key) {
		return Charge{}, errHTTPRecord
	}
	return ch, nil
}

// rows counts the committed charges of key.
func (a *PaymentsApp) rows(t *testing.T, key string) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + a.charges + " WHERE k = ?"
	if a.dialect == idem.Postgres {
		q = "SELECT COUNT(*) FROM " + a.charges + " WHERE k = $1"
	}
	var n int
	if err := a.db.QueryRowContext(context.Background(), q, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// httpProvider is the stand-in payment provider: per key, how often it
// was called, and what the running check makes it do.
type httpProvider struct {
	mu      sync.Mutex
	calls   map[string]int
	refs    map[string]string // by RelayKey
	hold    map[string]chan struct{}
	started map[string]chan struct{}
	delay   map[string]time.Duration
	fail    map[string]bool // Record fails once after its row
	// skewing are the keys whose first Record reads the whole charges
	// table before its row and, after it, waits for the rows of the
	// others: skew closes once skewers of them arrived (RunHTTPRetry).
	skewing  map[string]bool
	skewers  int
	arrivals int
	skew     chan struct{}
}

func newHTTPProvider() *httpProvider {
	return &httpProvider{calls: map[string]int{}, refs: map[string]string{}, hold: map[string]chan struct{}{},
		started: map[string]chan struct{}{}, delay: map[string]time.Duration{}, fail: map[string]bool{}, skewing: map[string]bool{}, skew: make(chan struct{})}
}

func (p *httpProvider) charge(ctx context.Context, key, relay string) (string, error) {
	p.mu.Lock()
	p.calls[key]++
	hold, delay := p.hold[key], p.delay[key]
	if s := p.started[key]; s != nil {
		close(s)
		delete(p.started, key)
	}
	p.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ref, ok := p.refs[relay]
	if !ok {
		ref = fmt.Sprintf("pr_%d", len(p.refs)+1)
		p.refs[relay] = ref
	}
	return ref, nil
}

func (p *httpProvider) failRecord(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.fail[key]
	delete(p.fail, key)
	return f
}

// skewed reports whether key's Record is its first under RunHTTPRetry.
func (p *httpProvider) skewed(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.skewing[key]
	delete(p.skewing, key)
	return s
}

// arrive waits until every skewing Record has written its row, or 10 s.
func (p *httpProvider) arrive(ctx context.Context) {
	p.mu.Lock()
	if p.arrivals++; p.arrivals == p.skewers {
		close(p.skew)
	}
	p.mu.Unlock()
	select {
	case <-p.skew:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
}

func (p *httpProvider) callsOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

// holdNext makes the provider's calls for key wait until release is
// called, and returns a channel closed when the next one starts.
func (p *httpProvider) holdNext(key string) (started <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hold, s := make(chan struct{}), make(chan struct{})
	p.hold[key], p.started[key] = hold, s
	return s, sync.OnceFunc(func() { close(hold) })
}

// httpClient sends the checks' requests.
type httpClient struct {
	url    string
	client *http.Client
}

// httpAnswer is an answer read whole.
type httpAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (r httpAnswer) replayed() bool {
	return r.header.Get(idemhttp.HeaderIdempotentReplayed) == "true"
}

func (r httpAnswer) String() string { return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body)) }

// post sends a charge of amount with key, as account acct-1.
func (c *httpClient) post(ctx context.Context, key string, amount int64) (httpAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(fmt.Sprintf(`{"amount": %d}`, amount)))
	if err != nil {
		return httpAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account", "acct-1")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, strconv.Quote(key))
	resp, err := c.client.Do(req)
	if err != nil {
		return httpAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return httpAnswer{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (c *httpClient) mustPost(t *testing.T, key string, amount int64) httpAnswer {
	t.Helper()
	r, err := c.post(context.Background(), key, amount)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// httpCreated asserts that r is the handler's 201 for a charge of amount
// and returns the charge.
func httpCreated(t *testing.T, r httpAnswer, amount int64) Charge {
	t.Helper()
	var ch Charge
	if r.status != http.StatusCreated {
		t.Fatalf("%v; want the handler's 201", r)
	}
	if err := json.Unmarshal(r.body, &ch); err != nil || ch.Amount != amount || ch.ID == "" {
		t.Fatalf("%v: want a charge of %d as JSON (%v)", r, amount, err)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if loc := r.header.Get("Location"); loc != "/v1/charges/"+ch.ID {
		t.Errorf("Location %q, want /v1/charges/%s", loc, ch.ID)
	}
	return ch
}

// httpProblem asserts that r is a problem of idemhttp's, of status and
// type typ.
func httpProblem(t *testing.T, r httpAnswer, status int, typ string) {
	t.Helper()
	var p idemhttp.Problem
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%v (Content-Type %q); want a %d problem", r, r.header.Get("Content-Type"), status)
	}
	if err := json.Unmarshal(r.body, &p); err != nil || p.Status != status || p.Type != typ {
		t.Fatalf("%v: want a problem of type %s (%v)", r, typ, err)
	}
}

// uniqueKey is a key no other check or run uses.
func uniqueKey(name string) string { return name + "-" + rand.Text()[:8] }

func httpRows(t *testing.T, app *PaymentsApp, c *httpClient) {
	key := uniqueKey("rows")
	app.provider.mu.Lock()
	app.provider.fail[key] = true
	app.provider.mu.Unlock()
	if r := c.mustPost(t, key, 100); r.status != http.StatusInternalServerError || r.replayed() {
		t.Fatalf("a record that fails after its row: %v; want the handler's 500", r)
	}
	if n := app.rows(t, key); n != 0 {
		t.Fatalf("%d rows after the handler answered 500; want 0: the row was written outside the middleware's transaction", n)
	}
	httpCreated(t, c.mustPost(t, key, 100), 100)
	if n := app.rows(t, key); n != 1 {
		t.Fatalf("%d rows after a 201, want 1", n)
	}
}

func httpReplay(t *testing.T, app *PaymentsApp, c *httpClient) {
	key := uniqueKey("replay")
	first := c.mustPost(t, key, 250)
	ch := httpCreated(t, first, 250)
	again := c.mustPost(t, key, 250)
	if !again.replayed() || first.replayed() {
		t.Fatalf("Idempotent-Replayed: %q on the first answer, %q on the retry; want only the retry's true", first.header.Get(idemhttp.HeaderIdempotentReplayed), again.header.Get(idemhttp.HeaderIdempotentReplayed))
	}
	if httpCreated(t, again, 250) != ch || !bytes.Equal(again.body, first.body) || again.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("replay %v (%q), want %v (%q) byte for byte", again, again.header.Get("Content-Type"), first, first.header.Get("Content-Type"))
	}
	if n, calls := app.rows(t, key), app.provider.callsOf(key); n != 1 || calls != 1 {
		t.Fatalf("%d rows, %d provider calls; want 1 and 1", n, calls)
	}
}

func httpReusedKey(t *testing.T, app *PaymentsApp, c *httpClient) {
	key := uniqueKey("reused")
	httpCreated(t, c.mustPost(t, key, 300), 300)
	httpProblem(t, c.mustPost(t, key, 301), http.StatusUnprocessableEntity, idemhttp.TypeMismatch)
	if n, calls := app.rows(t, key), app.provider.callsOf(key); n != 1 || calls != 1 {
		t.Fatalf("%d rows, %d provider calls; want 1 and 1", n, calls)
	}
}

func httpInFlight(t *testing.T, app *PaymentsApp, c *httpClient) {
	key := uniqueKey("inflight")
	started, release := app.provider.holdNext(key)
	defer release()
	type result struct {
		r   httpAnswer
		err error
	}
	firstc := make(chan result, 1)
	go func() {
		r, err := c.post(context.Background(), key, 400)
		firstc <- result{r, err}
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not call the provider within 30s")
	}
	dup := c.mustPost(t, key, 400)
	httpProblem(t, dup, http.StatusConflict, idemhttp.TypeInFlight)
	if s, err := strconv.Atoi(dup.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q, want whole seconds", dup.header.Get("Retry-After"))
	}
	release()
	first := <-firstc
	if first.err != nil {
		t.Fatal(first.err)
	}
	httpCreated(t, first.r, 400)
	again := c.mustPost(t, key, 400)
	if !again.replayed() || !bytes.Equal(again.body, first.r.body) {
		t.Fatalf("the duplicate's retry: %v, want the replay of %v", again, first.r)
	}
	if n, calls := app.rows(t, key), app.provider.callsOf(key); n != 1 || calls != 1 {
		t.Fatalf("%d rows, %d provider calls; want 1 and 1", n, calls)
	}
}

func httpClientGivesUp(t *testing.T, app *PaymentsApp, c *httpClient) {
	key := uniqueKey("gave-up")
	app.provider.mu.Lock()
	app.provider.delay[key] = 600 * time.Millisecond
	app.provider.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if r, err := c.post(ctx, key, 500); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the impatient attempt: %v, %v; want its own timeout", r, err)
	}
	var last httpAnswer
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		last = c.mustPost(t, key, 500)
		if last.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v 10s after the client gave up", last)
		}
	}
	httpCreated(t, last, 500)
	if !last.replayed() {
		t.Fatalf("the retry ran the charge again (%v); want the replay of the work the first attempt started", last)
	}
	if n, calls := app.rows(t, key), app.provider.callsOf(key); n != 1 || calls != 1 {
		t.Fatalf("%d rows, %d provider calls; want 1 and 1", n, calls)
	}
}

// RunHTTPRetry makes idemhttp run a handler of the service build returns
// a second time within one request, and returns the two answers'
// statuses, lowest first. Two charges of two keys run at once on
// PostgreSQL, in ModeTransaction at SERIALIZABLE; each reads the whole
// charges table before its row and waits for the other's row before it
// returns, a write skew that makes the database abort the second commit
// (or the statement that stores its answer): RunTx rolls that request
// back and runs it again, handler included. A router that runs its
// handler again gives [201 201]; one that cannot, and answers the second
// run 503 (idemgin), gives [201 503]. Either way every 201 committed its
// row once, a 503 is idemhttp's contention problem and stored nothing,
// and its client's retry gets a fresh 201.
func RunHTTPRetry(t *testing.T, build func(app *PaymentsApp) http.Handler) []int {
	t.Helper()
	app := newPaymentsApp(t, testdb.Postgres, idem.Postgres, idemserve.ModeTransaction, &sql.TxOptions{Isolation: sql.LevelSerializable})
	srv := httptest.NewServer(build(app))
	t.Cleanup(srv.Close)
	c := &httpClient{url: srv.URL + "/v1/charges", client: srv.Client()}
	keys := []string{uniqueKey("skew-a"), uniqueKey("skew-b")}
	app.provider.mu.Lock()
	for _, k := range keys {
		app.provider.skewing[k] = true
	}
	app.provider.skewers = len(keys)
	app.provider.mu.Unlock()
	var (
		wg      sync.WaitGroup
		answers = make([]httpAnswer, len(keys))
		errs    = make([]error, len(keys))
	)
	for i, k := range keys {
		wg.Go(func() { answers[i], errs[i] = c.post(context.Background(), k, int64(600+i)) })
	}
	wg.Wait()
	var statuses []int
	calls := 0
	for i, k := range keys {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		statuses = append(statuses, answers[i].status)
		calls += app.provider.callsOf(k)
	}
	slices.Sort(statuses)
	switch {
	case slices.Equal(statuses, []int{201, 201}) && calls == 2:
		t.Fatal("the database aborted neither transaction: no handler ran again, so this check proves nothing")
	case slices.Equal(statuses, []int{201, 201}) && calls == 3, slices.Equal(statuses, []int{201, 503}) && calls == 2:
	default:
		t.Fatalf("answers %v and %v after %d handler runs; want two 201s after 3 runs, or a 201 and a 503 after 2", answers[0], answers[1], calls)
	}
	for i, k := range keys {
		amount := int64(600 + i)
		if answers[i].status == http.StatusCreated {
			httpCreated(t, answers[i], amount)
		} else {
			httpProblem(t, answers[i], http.StatusServiceUnavailable, idemhttp.TypeContention)
			if n := app.rows(t, k); n != 0 {
				t.Fatalf("%d rows committed under a 503, want 0", n)
			}
			if r := c.mustPost(t, k, amount); r.replayed() {
				t.Fatalf("the retry after a 503 replayed %v: the 503 was stored", r)
			} else {
				httpCreated(t, r, amount)
			}
		}
		if n := app.rows(t, k); n != 1 {
			t.Fatalf("%d rows for %s, want 1", n, k)
		}
	}
	return statuses
}

// RouterEnv is what a router's own tests beside RunHTTP need: a Store on a
// table of the test's own and a business table (k, v), on PostgreSQL,
// dropped when the test ends.
type RouterEnv struct {
	DB    *sql.DB
	Store *idem.Store
	Biz   string // the business table
}

// NewRouterEnv makes the tables of a RouterEnv, named after prefix.
func NewRouterEnv(t *testing.T, prefix string) *RouterEnv {
	t.Helper()
	db, err := sql.Open("pgx", testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	suffix := strings.ToLower(rand.Text()[:10])
	store, err := idem.New(idem.Postgres, idem.WithTable(prefix+"_"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	biz := prefix + "_biz_" + suffix
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+biz+" (k text NOT NULL, v text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+biz+", "+store.Table()) })
	return &RouterEnv{DB: db, Store: store, Biz: biz}
}

// Middleware is idemhttp's middleware on the env's Store, for a single
// tenant.
func (e *RouterEnv) Middleware(t *testing.T) *idemhttp.Middleware {
	t.Helper()
	mw, err := idemhttp.New(idemhttp.Config{Store: e.Store, DB: e.DB, Scope: idemhttp.SingleTenant})
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// Insert writes a business row (k = the request's key, v) through the
// transaction of ctx, a handler's request context behind the middleware.
func (e *RouterEnv) Insert(ctx context.Context, v string) error {
	req, _ := idemhttp.RequestFrom(ctx)
	tx := idemhttp.TxFrom(ctx)
	if tx == nil {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+e.Biz+" (k, v) VALUES ($1, $2)", req.Key, v)
	return err
}

// Rows counts the business rows of key.
func (e *RouterEnv) Rows(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := e.DB.QueryRow("SELECT COUNT(*) FROM "+e.Biz+" WHERE k = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Answer is an answer as a router's test reads it.
type Answer struct {
	Status int
	Header http.Header
	Body   string
}

// Replayed reports whether the answer is a replay.
func (a Answer) Replayed() bool { return a.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true" }

// Post sends a POST of {} with the Idempotency-Key key to url, and reads
// the answer, its body without the white space around it (echo's JSON
// ends with a newline).
func Post(t *testing.T, url, key string) Answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Answer{resp.StatusCode, resp.Header, strings.TrimSpace(string(b))}
}
