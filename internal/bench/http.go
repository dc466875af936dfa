package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// HTTPConfig says what RunHTTP measures.
type HTTPConfig struct {
	DB      *sql.DB      // the pool the server's transactions run on
	Driver  string       // the database/sql driver's name, for the report
	Dialect idem.Dialect // the dialect of DB's server

	Rounds      int           // rounds: each path runs once a round through each handler (default 10)
	Duration    time.Duration // how long each run lasts (default 300ms)
	Concurrency []int         // client workers, each with a connection of its own (default 8)
}

func (c *HTTPConfig) defaults() error {
	if c.DB == nil || c.Dialect == nil {
		return errors.New("bench: HTTPConfig needs DB and Dialect")
	}
	if c.Rounds <= 0 {
		c.Rounds = 10
	}
	if c.Duration <= 0 {
		c.Duration = 300 * time.Millisecond
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{8}
	}
	return nil
}

// HTTPResult is one path at one concurrency, served by idemhttp and by the
// bare handler.
type HTTPResult struct {
	Path        string // fresh or replay
	Concurrency int
	// Middleware and Bare are requests per second through idemhttp and
	// through the bare handler, medians of the rounds.
	Middleware, Bare float64
	Ratio            float64   // Middleware over Bare in the same round, median of the rounds
	Ratios           []float64 // that ratio in each round
	// MiddlewareAllocs and BareAllocs are the heap allocations per
	// request in this process, client and server together, medians of the
	// rounds.
	MiddlewareAllocs, BareAllocs float64
}

// httpPath is one kind of request the HTTP benchmark sends: its key for
// worker w's requests to the handler at path h.
type httpPath struct {
	name   string
	key    func(e *Env, h string, w int) string
	replay bool
}

var httpPaths = []httpPath{
	{name: "fresh", key: func(e *Env, _ string, _ int) string { return e.Key() }},
	{name: "replay", key: func(_ *Env, h string, w int) string {
		return fmt.Sprintf("http-replay%s-%d", strings.ReplaceAll(h, "/", "-"), w)
	}, replay: true},
}

// RunHTTP measures what the HTTP layer costs: loopback HTTP requests
// served through idemhttp in transaction mode, and through a bare handler
// that does the least a handler must to run the same operation once per
// key (read the key and the body, fingerprint them, Do in RunTx, write
// the answer), with the same statements. In each round each path runs
// through both handlers, one right after the other, in turn first and
// second; the ratio is the middleware's rate over the bare handler's in
// the same round, median of the rounds. It writes the table to w and
// returns it.
func RunHTTP(ctx context.Context, cfg HTTPConfig, w io.Writer) ([]HTTPResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e, err := Setup(ctx, cfg.DB, cfg.Dialect)
	if err != nil {
		return nil, err
	}
	rs, err := runHTTP(ctx, e, cfg, w)
	return rs, errors.Join(err, e.Close(context.WithoutCancel(ctx)))
}

func runHTTP(ctx context.Context, e *Env, cfg HTTPConfig, w io.Writer) ([]HTTPResult, error) {
	srv, err := e.serveHTTP()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	fmt.Fprintf(w, "idem bench --http: %s driver, %s dialect; %d rounds, each path for %v through idemhttp and through a bare handler\n",
		cfg.Driver, cfg.Dialect.Name(), cfg.Rounds, cfg.Duration)
	var results []HTTPResult
	for _, conc := range cfg.Concurrency {
		client := srv.client(conc)
		for _, p := range httpPaths {
			if p.replay {
				for _, h := range []string{middlewarePath, barePath} {
					for w := range conc {
						if err := send(ctx, client, srv.url+h, p.key(e, h, w), false); err != nil {
							return nil, err
						}
					}
				}
			}
			// A short pass, not counted, warms the connections.
			for _, h := range []string{middlewarePath, barePath} {
				if _, err := measureHTTP(ctx, e, client, srv.url, h, p, conc, cfg.Duration/5); err != nil {
					return nil, err
				}
			}
			r := HTTPResult{Path: p.name, Concurrency: conc}
			var mw, bare, mwAllocs, bareAllocs []float64
			for round := range cfg.Rounds {
				order := []string{middlewarePath, barePath}
				if round%2 == 1 {
					slices.Reverse(order)
				}
				rate := map[string]httpRun{}
				for _, h := range order {
					m, err := measureHTTP(ctx, e, client, srv.url, h, p, conc, cfg.Duration)
					if err != nil {
						return nil, err
					}
					rate[h] = m
				}
				mw, bare = append(mw, rate[middlewarePath].rate), append(bare, rate[barePath].rate)
				mwAllocs, bareAllocs = append(mwAllocs, rate[middlewarePath].allocs), append(bareAllocs, rate[barePath].allocs)
				r.Ratios = append(r.Ratios, rate[middlewarePath].rate/rate[barePath].rate)
			}
			r.Middleware, r.Bare, r.Ratio = median(mw), median(bare), median(r.Ratios)
			r.MiddlewareAllocs, r.BareAllocs = median(mwAllocs), median(bareAllocs)
			results = append(results, r)
		}
		client.CloseIdleConnections()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tworkers\tidemhttp req/s\tbare req/s\tratio\tratio range\tidemhttp allocs/req\tbare allocs/req\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.2f\t%.2f-%.2f\t%.0f\t%.0f\t\n", r.Path, r.Concurrency, r.Middleware, r.Bare, r.Ratio,
			slices.Min(r.Ratios), slices.Max(r.Ratios), r.MiddlewareAllocs, r.BareAllocs)
	}
	return results, tw.Flush()
}

// The handlers' paths on the benchmark's server.
const (
	middlewarePath = "/idemhttp/orders"
	barePath       = "/bare/orders"
)

// httpServer is the benchmark's loopback server.
type httpServer struct {
	srv *http.Server
	url string
}

// serveHTTP starts a loopback server with the two handlers, on e's tables:
// idemhttp in transaction mode around a handler that inserts one order row
// through its transaction and answers 201, and the bare handler that does
// the same around Do itself.
func (e *Env) serveHTTP() (*httpServer, error) {
	mw, err := idemhttp.New(idemhttp.Config{Store: e.store, DB: e.db,
		Scope: func(*http.Request) (string, error) { return "bench", nil }})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+middlewarePath, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := e.order(r.Context(), idemhttp.TxFrom(r.Context()), "http"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(response.StatusCode)
		_, _ = w.Write(response.Body)
	})))
	mux.HandleFunc("POST "+barePath, e.bareHandler)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	s := &httpServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, url: "http://" + ln.Addr().String()}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *httpServer) close() { _ = s.srv.Close() }

// client is an HTTP client that keeps a connection per worker.
func (s *httpServer) client(conc int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}}
}

// bareHandler is the least a handler does to run the operation once per
// key by hand: it reads the key and the body, fingerprints the method,
// path and body as they are, runs Do in RunTx with the operation
// idemhttp's handler has (method and path), and writes the answer, marked
// when it is a replay. A request without a key, or whose Do fails, is a
// plain error.
func (e *Env) bareHandler(w http.ResponseWriter, r *http.Request) {
	key := strings.Trim(r.Header.Get(idemhttp.HeaderIdempotencyKey), `"`)
	body, err := io.ReadAll(io.LimitReader(r.Body, idemhttp.DefaultMaxBody+1))
	if err != nil || key == "" {
		http.Error(w, "want a key and a body", http.StatusBadRequest)
		return
	}
	path := r.URL.EscapedPath()
	req := idem.Request{Scope: "bench", Key: key, Operation: r.Method + " " + path,
		Fingerprint: idem.Fingerprint([]byte(r.Method), []byte(path), body)}
	var res idem.Result
	err = idem.RunTx(r.Context(), e.db, nil, func(tx *sql.Tx) error {
		res, err = e.store.Do(r.Context(), tx, req, func(ctx context.Context) (idem.Response, error) {
			return idem.Response{StatusCode: response.StatusCode, Header: jsonHeader, Body: response.Body}, e.order(ctx, tx, "http")
		})
		return err
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", res.Header.Get("Content-Type"))
	if res.Replayed {
		h.Set(idemhttp.HeaderIdempotentReplayed, "true")
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(res.Body)
}

var jsonHeader = http.Header{"Content-Type": {"application/json"}}

// requestBody is the body of every request.
var requestBody = []byte(`{"amount": 100, "currency": "EUR"}`)

// send posts one request with key to url and checks the answer: 201, a
// replay exactly when replay is true.
func send(ctx context.Context, client *http.Client, url, key string, replay bool) error {
	return sendWith(ctx, client, url, key, replay, nil)
}

// sendWith is send of a request with the fields of header too.
func sendWith(ctx context.Context, client *http.Client, url, key string, replay bool, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(requestBody))
	if err != nil {
		return err
	}
	for name, values := range header {
		req.Header[name] = values
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"`+key+`"`)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if replayed := resp.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true"; resp.StatusCode != response.StatusCode || replayed != replay {
		return fmt.Errorf("bench: POST %s with key %q: %d, replayed %v (%s); want %d, replayed %v", url, key, resp.StatusCode, replayed, b, response.StatusCode, replay)
	}
	return nil
}

// httpRun is one measured run: requests per second, and heap allocations per
// request in this process.
type httpRun struct{ rate, allocs float64 }

// measureHTTP sends requests of p to the handler at path h of the server
// at url from conc workers for d, each at least one, and returns the rate
// and allocations per request.
func measureHTTP(ctx context.Context, e *Env, client *http.Client, url, h string, p httpPath, conc int, d time.Duration) (httpRun, error) {
	return measureSends(ctx, conc, d, func(ctx context.Context, w int) error {
		return send(ctx, client, url+h, p.key(e, h, w), p.replay)
	})
}

// measureSends runs send, which sends one request of worker w and checks
// its answer, in a loop in each of conc workers for d, each at least
// once, and returns the rate and the allocations per request.
func measureSends(ctx context.Context, conc int, d time.Duration, send func(ctx context.Context, w int) error) (httpRun, error) {
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := send(ctx, w); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					cancel()
					return
				}
				done.Add(1)
				if !time.Now().Before(deadline) {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if first != nil {
		return httpRun{}, first
	}
	n := float64(done.Load())
	return httpRun{rate: n / elapsed.Seconds(), allocs: float64(after.Mallocs-before.Mallocs) / n}, nil
}
