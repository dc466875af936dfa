// Package bench measures idem against a bare transaction, in one process
// against one server: rounds in which each path runs right beside a bare
// transaction at the same concurrency, reported as transactions per second
// and as the ratio to the bare run beside it, median of the rounds. It
// backs `idem bench` and the Go benchmarks, and creates and drops tables of
// its own.
package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
)

// Config says what to measure.
type Config struct {
	DB      *sql.DB      // the pool to measure through; its size bounds the storm's concurrency
	Driver  string       // the database/sql driver's name, for the report
	Dialect idem.Dialect // the dialect of DB's server

	Rounds      int           // rounds: each path runs once a round, beside a bare run (default 10)
	Duration    time.Duration // how long each run lasts (default 300ms)
	Concurrency []int         // worker counts (default 1 and 16)
	HotWorkers  int           // workers replaying one hot key (default 16)

	StormRequests int           // concurrent requests with one key (default 64)
	StormWork     time.Duration // how long the operation takes (default 50ms)
	Storms        int           // storms run per mode; their latencies are pooled (default 5; negative: none)
	// StormPoll is how long a client of the claim-mode storm waits after a
	// 409 before it tries again (default 20ms). Not the error's RetryAfter:
	// that is the remaining lease (30s by default), meant for operations
	// that take that long.
	StormPoll time.Duration
}

func (c *Config) defaults() error {
	if c.DB == nil || c.Dialect == nil {
		return errors.New("bench: Config needs DB and Dialect")
	}
	if c.Rounds <= 0 {
		c.Rounds = 10
	}
	if c.Duration <= 0 {
		c.Duration = 300 * time.Millisecond
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 16}
	}
	if c.HotWorkers <= 0 {
		c.HotWorkers = 16
	}
	if c.StormRequests <= 0 {
		c.StormRequests = 64
	}
	if c.StormWork <= 0 {
		c.StormWork = 50 * time.Millisecond
	}
	if c.Storms == 0 {
		c.Storms = 5
	}
	if c.StormPoll <= 0 {
		c.StormPoll = 20 * time.Millisecond
	}
	return nil
}

// Report is the outcome of Run.
type Report struct {
	Driver  string
	Dialect string
	Rounds  int
	Results []Result
	Storms  []Storm
}

// Result is one path at one concurrency.
type Result struct {
	Path        string    // bare, fresh, replay or hot
	Concurrency int       // concurrent workers, each with its own transaction
	TxPerSec    float64   // committed transactions per second, median of the rounds
	Ratio       float64   // TxPerSec over the bare transaction's in the same round, median of the rounds
	Rates       []float64 // transactions per second in each run (bare runs beside every other path)
	Ratios      []float64 // the ratio in each round
}

// Storm is the latency of a storm of concurrent requests with one key:
// from the moment they all start until each has its answer.
type Storm struct {
	// Mode is "tx" (Do in the caller's transaction, through idem.RunTx) or
	// "claim, poll 20ms" (Begin, the operation outside any transaction,
	// Complete in the business transaction; a client that gets a 409 waits
	// StormPoll and tries again).
	Mode     string
	Requests int
	Work     time.Duration // how long the operation took
	Runs     int           // storms pooled
	P50, P99 time.Duration
	Max      time.Duration
	Attempts float64 // tries per request: transactions begun in tx mode (above 1: retries through idem.RunTx), Begin calls in claim mode
}

// path is one kind of transaction the benchmark runs.
type path struct {
	name string
	// worker returns the loop body of worker w.
	worker func(e *Env, w int) func(context.Context) error
	// hot paths run only at HotWorkers.
	hot bool
}

// replayKey is the completed key worker w replays.
func replayKey(w int) string { return fmt.Sprintf("replay-%d", w) }

const hotKey = "hot"

// paths are what the benchmark runs; the first, bare, is the baseline of
// every ratio.
var paths = []path{
	{name: "bare", worker: func(e *Env, _ int) func(context.Context) error { return e.Bare }},
	{name: "fresh", worker: func(e *Env, _ int) func(context.Context) error { return e.Fresh }},
	{name: "replay", worker: func(e *Env, w int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Do(ctx, replayKey(w), true) }
	}},
	{name: "claim", worker: func(e *Env, _ int) func(context.Context) error { return e.Claim }},
	{name: "hot", hot: true, worker: func(e *Env, _ int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Do(ctx, hotKey, true) }
	}},
}

// Run measures every path, writes the table to w as it finishes and
// returns it.
func Run(ctx context.Context, cfg Config, w io.Writer) (Report, error) {
	if err := cfg.defaults(); err != nil {
		return Report{}, err
	}
	e, err := Setup(ctx, cfg.DB, cfg.Dialect)
	if err != nil {
		return Report{}, err
	}
	rep, err := run(ctx, e, cfg, w)
	return rep, errors.Join(err, e.Close(context.WithoutCancel(ctx)))
}

// cell is the per-round measurements of one path at one concurrency.
type cell struct {
	path   path
	conc   int
	rates  []float64
	ratios []float64
}

func run(ctx context.Context, e *Env, cfg Config, w io.Writer) (Report, error) {
	rep := Report{Driver: cfg.Driver, Dialect: cfg.Dialect.Name(), Rounds: cfg.Rounds}
	maxConc := max(slices.Max(cfg.Concurrency), cfg.HotWorkers)
	for i := range maxConc {
		if err := e.Do(ctx, replayKey(i), false); err != nil {
			return rep, err
		}
	}
	if err := e.Do(ctx, hotKey, false); err != nil {
		return rep, err
	}
	fmt.Fprintf(w, "idem bench: %s driver, %s dialect; %d rounds, each path for %v beside a bare run of %v\n",
		cfg.Driver, rep.Dialect, cfg.Rounds, cfg.Duration, cfg.Duration)

	bare := paths[0]
	var cells []*cell
	bares := map[int]*cell{}
	add := func(p path, conc int) {
		if bares[conc] == nil {
			bares[conc] = &cell{path: bare, conc: conc}
		}
		cells = append(cells, &cell{path: p, conc: conc})
	}
	for _, c := range cfg.Concurrency {
		for _, p := range paths {
			if p.name != bare.name && !p.hot {
				add(p, c)
			}
		}
	}
	for _, p := range paths {
		if p.hot {
			add(p, cfg.HotWorkers)
		}
	}
	// A short pass, not counted, opens the pool's connections and fills
	// the drivers' statement caches.
	for _, c := range cells {
		for _, p := range []path{bare, c.path} {
			if _, err := measure(ctx, e, p, c.conc, cfg.Duration/5); err != nil {
				return rep, fmt.Errorf("bench: %s at concurrency %d: %w", p.name, c.conc, err)
			}
		}
	}
	// Each path runs right beside a bare run at the same concurrency, in
	// turn before and after it, and the order of the paths rotates from
	// round to round: load from outside that changes over seconds then
	// weighs on both sides of each ratio alike.
	for round := range cfg.Rounds {
		for _, st := range schedule(len(cells), round) {
			c := cells[st.cell]
			b := bares[c.conc]
			order := []*cell{b, c}
			if !st.bareFirst {
				order = []*cell{c, b}
			}
			var rates [2]float64
			for k, o := range order {
				rate, err := measure(ctx, e, o.path, o.conc, cfg.Duration)
				if err != nil {
					return rep, fmt.Errorf("bench: %s at concurrency %d: %w", o.path.name, o.conc, err)
				}
				o.rates = append(o.rates, rate)
				rates[k] = rate
			}
			if order[0] == b {
				c.ratios = append(c.ratios, rates[1]/rates[0])
			} else {
				c.ratios = append(c.ratios, rates[0]/rates[1])
			}
		}
	}
	for _, conc := range slices.Sorted(maps.Keys(bares)) {
		b := bares[conc]
		rep.Results = append(rep.Results, Result{Path: "bare", Concurrency: conc, TxPerSec: median(b.rates), Ratio: 1, Rates: b.rates, Ratios: slices.Repeat([]float64{1}, len(b.rates))})
		for _, c := range cells {
			if c.conc == conc {
				rep.Results = append(rep.Results, Result{Path: c.path.name, Concurrency: conc, TxPerSec: median(c.rates), Ratio: median(c.ratios), Rates: c.rates, Ratios: c.ratios})
			}
		}
	}
	printResults(w, rep.Results)

	if cfg.Storms > 0 {
		for _, mode := range []struct {
			name string
			poll time.Duration
			req  func(e *Env, key string, work, poll time.Duration, runs, attempts *atomic.Int64) func(context.Context) error
		}{
			{"tx", 0, txRequest},
			{"claim, poll " + cfg.StormPoll.String(), cfg.StormPoll, claimRequest},
		} {
			s, err := storm(ctx, e, cfg, mode.name, func(key string, runs, attempts *atomic.Int64) func(context.Context) error {
				return mode.req(e, key, cfg.StormWork, mode.poll, runs, attempts)
			})
			if err != nil {
				return rep, err
			}
			rep.Storms = append(rep.Storms, s)
		}
		printStorms(w, rep.Storms)
	}
	return rep, nil
}

// step is one pairing of a round: a cell, and whether its bare run comes
// before the cell's own run.
type step struct {
	cell      int
	bareFirst bool
}

// schedule is the order of round's pairings: every cell once, starting one
// further along each round, and a cell's bare run before its own in
// alternate rounds, so that each path runs as often after its bare run as
// before it.
func schedule(cells, round int) []step {
	steps := make([]step, cells)
	for i := range steps {
		j := (i + round) % cells
		steps[i] = step{cell: j, bareFirst: (j+round)%2 == 0}
	}
	return steps
}

// measure runs conc workers of p for d, each for at least one
// transaction (so that a rate is never 0 and a ratio never NaN), and
// returns committed transactions per second.
func measure(ctx context.Context, e *Env, p path, conc int, d time.Duration) (float64, error) {
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		body := p.worker(e, w)
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := body(ctx); err != nil {
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
	if first != nil {
		return 0, first
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// storm sends cfg.StormRequests concurrent requests with one key, made by
// request, cfg.Storms times, and checks that each storm ran the operation
// once and stored one order row. A first storm, not counted, fills the
// pool, so that opening connections is not measured.
func storm(ctx context.Context, e *Env, cfg Config, mode string, request func(key string, runs, attempts *atomic.Int64) func(context.Context) error) (Storm, error) {
	var (
		lat      []time.Duration
		attempts atomic.Int64
	)
	for i := range cfg.Storms + 1 {
		if i == 1 {
			lat = lat[:0]
			attempts.Store(0)
		}
		key := e.Key()
		var (
			runs  atomic.Int64
			wg    sync.WaitGroup
			mu    sync.Mutex
			errs  []error
			ready sync.WaitGroup
			gate  = make(chan struct{})
			start time.Time
		)
		ready.Add(cfg.StormRequests)
		for range cfg.StormRequests {
			do := request(key, &runs, &attempts)
			wg.Go(func() {
				ready.Done()
				<-gate
				err := do(ctx)
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				lat = append(lat, d)
			})
		}
		ready.Wait()
		start = time.Now()
		close(gate)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return Storm{}, fmt.Errorf("bench: %s storm: %w", mode, err)
		}
		n, err := e.Orders(ctx, key)
		if err != nil {
			return Storm{}, fmt.Errorf("bench: %s storm: %w", mode, err)
		}
		if runs.Load() != 1 || n != 1 {
			return Storm{}, fmt.Errorf("bench: %s storm on key %q ran the operation %d times and stored %d order rows, want 1 and 1", mode, key, runs.Load(), n)
		}
	}
	slices.Sort(lat)
	return Storm{
		Mode: mode, Requests: cfg.StormRequests, Work: cfg.StormWork, Runs: cfg.Storms,
		P50: quantile(lat, 0.50), P99: quantile(lat, 0.99), Max: lat[len(lat)-1],
		Attempts: float64(attempts.Load()) / float64(len(lat)),
	}, nil
}

// txRequest is a request that runs Do in a transaction of its own through
// idem.RunTx, with an operation that takes work and inserts an order row.
func txRequest(e *Env, key string, work, _ time.Duration, runs, attempts *atomic.Int64) func(context.Context) error {
	return func(ctx context.Context) error {
		return idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
			attempts.Add(1)
			_, err := e.store.Do(ctx, tx, Request(key), func(ctx context.Context) (idem.Response, error) {
				runs.Add(1)
				if err := sleep(ctx, work); err != nil {
					return idem.Response{}, err
				}
				return response, e.order(ctx, tx, key)
			})
			return err
		})
	}
}

// claimRequest is a client of the two-phase path: Begin; on a claim, the
// work outside any transaction, then a business transaction that inserts
// an order row and completes the claim; on a 409, a wait of poll and
// another try.
func claimRequest(e *Env, key string, work, poll time.Duration, runs, attempts *atomic.Int64) func(context.Context) error {
	return func(ctx context.Context) error {
		for {
			attempts.Add(1)
			c, replay, err := e.store.Begin(ctx, e.db, Request(key))
			if errors.Is(err, idem.ErrInFlight) {
				if err := sleep(ctx, poll); err != nil {
					return err
				}
				continue
			}
			if err != nil || replay != nil {
				return err
			}
			runs.Add(1)
			if err := sleep(ctx, work); err != nil {
				return err
			}
			return idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
				if err := e.order(ctx, tx, key); err != nil {
					return err
				}
				return c.Complete(ctx, tx, response)
			})
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// quantile is the q-quantile of sorted xs (nearest rank).
func quantile(xs []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func printResults(w io.Writer, rs []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tworkers\ttx/s\tratio to bare\tratio range\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f-%.2f\t\n", r.Path, r.Concurrency, r.TxPerSec, r.Ratio, slices.Min(r.Ratios), slices.Max(r.Ratios))
	}
	_ = tw.Flush()
}

func printStorms(w io.Writer, ss []Storm) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "storm\trequests\toperation\tstorms\tp50\tp99\tmax\tattempts/request\t")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%d\t%v\t%v\t%v\t%.2f\t\n", s.Mode, s.Requests, s.Work, s.Runs,
			s.P50.Round(100*time.Microsecond), s.P99.Round(100*time.Microsecond), s.Max.Round(100*time.Microsecond), s.Attempts)
	}
	_ = tw.Flush()
}
