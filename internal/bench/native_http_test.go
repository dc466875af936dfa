package bench

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
)

// The HTTP layer on pgx itself: idemhttp's middleware on idempgx's Runner,
// whose transactions send BEGIN with the claim and the completion with
// COMMIT (pipelined), beside the same middleware on a Runner that begins
// pgx's own transactions, as every Runner of idempgx's did before it
// pipelined (begintx: five round trips for a fresh request), and beside a
// handler of a one-read transaction (read), the floor of a replay.

// The ways a request to the pgx HTTP server is served: the value of its
// viaHeader.
const (
	viaPipelined = "pipelined" // idemhttp on idempgx.New's Runner
	viaBeginTx   = "begintx"   // idemhttp on unpipelined
	viaRead      = "read"      // the one-read transaction
)

const (
	viaHeader    = "X-Bench-Via"
	workerHeader = "X-Bench-Worker" // a replay from another instance: the worker whose middleware serves it
)

// unpipelined is idempgx's Runner without its pipelining (it is no
// idem.Pipeliner): its transactions are BeginTx's.
type unpipelined struct {
	idem.Runner
	r *idempgx.Runner
}

func (u unpipelined) Unwrap(t idem.Tx) pgx.Tx { return u.r.Unwrap(t) }

// pgxServer is the loopback server of the pgx HTTP measurements. Every
// request goes to one path, so that its operation and fingerprint are the
// same whichever way it is served and a key completed one way replays the
// other; viaHeader picks the way.
type pgxServer struct {
	n       *native
	srv     *http.Server
	url     string
	runners map[string]idem.Runner
	// served is idemhttp on the Env's Store, by way.
	served map[string]http.Handler
	// cross is, by way and worker, the middleware of a Store that has
	// not served the worker's current turn of keys: replays from another
	// instance, a new one for each turn (next).
	cross map[string][]atomic.Pointer[http.Handler]
	// turns is, by way and worker, how many of the worker's cross keys
	// have been sent.
	turns map[string][]atomic.Int64
}

// serveHTTP starts n's loopback server, with cross middlewares for
// workers workers.
func (n *native) serveHTTP(tb testing.TB, workers int) *pgxServer {
	tb.Helper()
	r := idempgx.New(n.pool, pgx.TxOptions{})
	s := &pgxServer{n: n, runners: map[string]idem.Runner{viaPipelined: r, viaBeginTx: unpipelined{r, r}},
		served: map[string]http.Handler{}, cross: map[string][]atomic.Pointer[http.Handler]{}, turns: map[string][]atomic.Int64{}}
	for via := range s.runners {
		s.served[via] = s.middleware(tb, via, n.e.store)
		s.cross[via] = make([]atomic.Pointer[http.Handler], workers)
		s.turns[via] = make([]atomic.Int64, workers)
		for w := range workers {
			s.rotate(tb, via, w)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.url = "http://" + ln.Addr().String() + "/orders"
	go func() { _ = s.srv.Serve(ln) }()
	tb.Cleanup(func() { _ = s.srv.Close() })
	return s
}

// middleware is idemhttp on via's Runner and the Store st, in transaction
// mode, around a handler that inserts one order row through the pgx
// transaction and answers 201.
func (s *pgxServer) middleware(tb testing.TB, via string, st *idem.Store) http.Handler {
	mw, err := idemhttp.New(idemhttp.Config{Store: st, Runner: s.runners[via],
		Scope: func(*http.Request) (string, error) { return "bench", nil }})
	if err != nil {
		tb.Fatal(err)
	}
	return mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.n.order(r.Context(), idempgx.TxFrom(r.Context()), "http"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(response.StatusCode)
		_, _ = w.Write(response.Body)
	}))
}

// rotate gives worker w of via a middleware of a new Store on the Env's
// table: another instance, which has served none of the worker's keys.
func (s *pgxServer) rotate(tb testing.TB, via string, w int) {
	st, err := idem.New(s.n.e.dialect, idem.WithTable(s.n.e.store.Table()))
	if err != nil {
		tb.Fatal(err)
	}
	h := s.middleware(tb, via, st)
	s.cross[via][w].Store(&h)
}

func (s *pgxServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	via := r.Header.Get(viaHeader)
	switch worker := r.Header.Get(workerHeader); {
	case via == viaRead:
		s.read(w, r)
	case worker != "":
		i, _ := strconv.Atoi(worker)
		(*s.cross[via][i].Load()).ServeHTTP(w, r)
	default:
		s.served[via].ServeHTTP(w, r)
	}
}

// read is the least a handler does to replay a stored answer by hand: it
// reads the key and the body, reads the answer in a one-read transaction
// (BEGIN; SELECT; COMMIT, the read path's) and writes it, marked as a
// replay.
func (s *pgxServer) read(w http.ResponseWriter, r *http.Request) {
	key := strings.Trim(r.Header.Get(idemhttp.HeaderIdempotencyKey), `"`)
	if _, err := io.ReadAll(io.LimitReader(r.Body, idemhttp.DefaultMaxBody+1)); err != nil || key == "" {
		http.Error(w, "want a key and a body", http.StatusBadRequest)
		return
	}
	var (
		op, fp, status string
		code           sql.NullInt64
		header, answer []byte
	)
	err := s.n.tx(r.Context(), func(tx pgx.Tx) error {
		return tx.QueryRow(r.Context(), s.n.e.floorRead, "bench", key).Scan(&op, &fp, &status, &code, &header, &answer)
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(idemhttp.HeaderIdempotentReplayed, "true")
	w.WriteHeader(int(code.Int64))
	_, _ = w.Write(answer)
}

// httpCrossKey is the i-th key worker w replays from another instance.
func httpCrossKey(w, i int) string { return fmt.Sprintf("http-cross-%d-%d", w, i) }

// seedCross completes the cross keys of workers workers, through idemhttp.
func (s *pgxServer) seedCross(ctx context.Context, client *http.Client, workers int) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range crossKeys {
				if errs[w] = sendWith(ctx, client, s.url, httpCrossKey(w, i), false, http.Header{viaHeader: {viaPipelined}}); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pgxHTTPPath is one kind of request to the pgx server.
type pgxHTTPPath struct {
	name string
	via  string
	// send sends worker w's next request of the path.
	send func(ctx context.Context, tb testing.TB, s *pgxServer, client *http.Client, w int) error
}

// sender is p's send for worker 0, as a loop body.
func (p pgxHTTPPath) sender(tb testing.TB, s *pgxServer, client *http.Client) func(context.Context) error {
	return func(ctx context.Context) error { return p.send(ctx, tb, s, client, 0) }
}

func freshPath(via string) pgxHTTPPath {
	return pgxHTTPPath{"fresh", via, func(ctx context.Context, _ testing.TB, s *pgxServer, client *http.Client, _ int) error {
		return sendWith(ctx, client, s.url, s.n.e.Key(), false, http.Header{viaHeader: {via}})
	}}
}

// crossPath replays the worker's cross keys in turn, each through a
// middleware whose Store has not served it: a replay from another
// instance, whose client does not say it is a retry.
func crossPath(via string) pgxHTTPPath {
	return pgxHTTPPath{"cross", via, func(ctx context.Context, tb testing.TB, s *pgxServer, client *http.Client, w int) error {
		i := int(s.turns[via][w].Add(1) - 1)
		if i > 0 && i%crossKeys == 0 {
			s.rotate(tb, via, w)
		}
		return sendWith(ctx, client, s.url, httpCrossKey(w, i%crossKeys), true, http.Header{viaHeader: {via}, workerHeader: {strconv.Itoa(w)}})
	}}
}

var readPath = pgxHTTPPath{"read", viaRead, func(ctx context.Context, _ testing.TB, s *pgxServer, client *http.Client, w int) error {
	return sendWith(ctx, client, s.url, replayKey(w), true, http.Header{viaHeader: {viaRead}})
}}

// pgxHTTPPairs are what the pgx HTTP measurement compares, each path with
// the one beside it: a fresh request pipelined and not, and a replay from
// another instance, pipelined and not, with the one-read transaction.
var pgxHTTPPairs = [][2]pgxHTTPPath{
	{freshPath(viaPipelined), freshPath(viaBeginTx)},
	{crossPath(viaPipelined), readPath},
	{crossPath(viaBeginTx), readPath},
}

// pgxHTTPResult is one pair of paths measured side by side.
type pgxHTTPResult struct {
	path, beside string
	rate, other  float64   // requests per second, medians of the rounds
	ratio        float64   // rate over other in the same round, median of the rounds
	ratios       []float64 // that ratio in each round
}

// runHTTPPgx measures each pair of pgxHTTPPairs at conc workers a path:
// in each round both paths of a pair run at once for d, as #34 measured
// the floor, so that what else loads the machine loads both; the ratio is
// the first's rate over the second's in the same round, median of the
// rounds. It writes the table to w.
func runHTTPPgx(ctx context.Context, tb testing.TB, n *native, rounds, conc int, d time.Duration, w io.Writer) ([]pgxHTTPResult, error) {
	s := n.serveHTTP(tb, conc)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * conc, MaxConnsPerHost: 2 * conc, DisableCompression: true}}
	defer client.CloseIdleConnections()
	if err := s.seedCross(ctx, client, conc); err != nil {
		return nil, err
	}
	run := func(pair [2]pgxHTTPPath, d time.Duration) ([]float64, error) {
		ps := make([]path, len(pair))
		for i, p := range pair {
			ps[i] = path{name: p.name + " " + p.via, worker: func(_ *Env, w int) func(context.Context) error {
				w %= conc // the second path's workers are conc and on
				return func(ctx context.Context) error { return p.send(ctx, tb, s, client, w) }
			}}
		}
		rates, err := measureTogether(ctx, n.e, ps, conc, d)
		if err != nil {
			return nil, fmt.Errorf("bench: %s beside %s: %w", ps[0].name, ps[1].name, err)
		}
		return rates, nil
	}
	for _, pair := range pgxHTTPPairs { // a short pass, not counted, warms the connections
		if _, err := run(pair, d/5); err != nil {
			return nil, err
		}
	}
	rates := make([][2][]float64, len(pgxHTTPPairs))
	var results []pgxHTTPResult
	for range rounds {
		for i, pair := range pgxHTTPPairs {
			m, err := run(pair, d)
			if err != nil {
				return nil, err
			}
			for side := range pair {
				rates[i][side] = append(rates[i][side], m[side])
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\treq/s\tbeside\treq/s\tratio\tratio range\t\n")
	for i, pair := range pgxHTTPPairs {
		r := pgxHTTPResult{path: pair[0].name + " " + pair[0].via, beside: pair[1].name + " " + pair[1].via,
			rate: median(rates[i][0]), other: median(rates[i][1])}
		for k := range rates[i][0] {
			r.ratios = append(r.ratios, rates[i][0][k]/rates[i][1][k])
		}
		r.ratio = median(r.ratios)
		results = append(results, r)
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.2f\t%.2f-%.2f\t\n", r.path, r.rate, r.beside, r.other, r.ratio, slices.Min(r.ratios), slices.Max(r.ratios))
	}
	return results, tw.Flush()
}

// nativeOn is a native of an Env on pgx's database/sql target, whose
// floor's table has the answers of workers workers' replayKey, with a
// pool of 40 connections of its own, pipelined.
func nativeOn(tb testing.TB, workers int) *native {
	tb.Helper()
	ctx := context.Background()
	tg := targets[0] // pgx's database/sql driver: the Env's tables
	e, err := Setup(ctx, tg.open(tb), tg.dialect)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close(ctx) })
	for w := range workers {
		if err := e.tx(ctx, func(tx *sql.Tx) error { return e.floorOp(ctx, tx, replayKey(w)) }); err != nil {
			tb.Fatal(err)
		}
	}
	return &native{e: e, pool: nativePool(tb), pipelined: true}
}

// nativePool is a pool of 40 connections of pgx's own to the server of
// pgx's database/sql target, closed when tb ends: through a delayProxy
// when IDEM_BENCH_DB_RTT asks for a round trip.
func nativePool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(withParams(targets[0].server.DSN(tb)))
	if err != nil {
		tb.Fatal(err)
	}
	if rtt := dbRTT(tb); rtt > 0 {
		proxy := startDelayProxy(tb, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), rtt)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = proxy.IP.String(), uint16(proxy.Port), nil
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// TestRunHTTPPgx runs the pgx HTTP measurement briefly and checks its
// shape. With IDEM_BENCH set it runs it in full at 8 workers a path
// (IDEM_BENCH_ROUNDS rounds, default 10, of 1 s a pair) and prints it:
// the figures of docs/benchmarks.md, on a database across a network
// with IDEM_BENCH_DB_RTT. It checks no ratio: a measurement is no test.
func TestRunHTTPPgx(t *testing.T) {
	rounds, conc, d := 2, 2, 50*time.Millisecond
	if os.Getenv("IDEM_BENCH") != "" {
		n, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS"))
		rounds, conc, d = cmp.Or(n, 10), 8, time.Second
	}
	var out strings.Builder
	rs, err := runHTTPPgx(context.Background(), t, nativeOn(t, conc), rounds, conc, d, &out)
	t.Logf("pgx, round trip to the database %v, %d rounds of %v a pair, %d workers a path:\n%s", dbRTT(t), rounds, d, conc, out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(pgxHTTPPairs) {
		t.Fatalf("%d results, want %d", len(rs), len(pgxHTTPPairs))
	}
	for _, r := range rs {
		if r.rate <= 0 || r.other <= 0 || len(r.ratios) != rounds {
			t.Errorf("%+v: want rates and a ratio per round", r)
		}
	}
}

// BenchmarkHTTPPgx sends each path of the pgx HTTP measurement from 8
// workers, with allocations per request (client and server together, in
// this process), to profile the pipelined middleware with:
//
//	go test -run '^$' -bench 'BenchmarkHTTPPgx/fresh-pipelined' -benchtime 5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkHTTPPgx(b *testing.B) {
	const conc = 8
	ctx := context.Background()
	n := nativeOn(b, conc)
	s := n.serveHTTP(b, conc)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}}
	b.Cleanup(client.CloseIdleConnections)
	if err := s.seedCross(ctx, client, conc); err != nil {
		b.Fatal(err)
	}
	for _, p := range []pgxHTTPPath{freshPath(viaPipelined), freshPath(viaBeginTx), crossPath(viaPipelined), crossPath(viaBeginTx), readPath} {
		b.Run(p.name+"-"+p.via, func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			parallel(b, conc, func(int) func(context.Context) error {
				w := int(next.Add(1)-1) % conc
				return func(ctx context.Context) error { return p.send(ctx, b, s, client, w) }
			})
		})
	}
}
