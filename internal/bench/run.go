// Package bench measures idem against a bare transaction and against the
// cheapest hand-written transaction that does the same job (its floor), in
// one process against one server: rounds in which each path runs right
// beside a bare transaction at the same concurrency, and beside its floor
// when it has one, reported as transactions per second and as the ratio to
// the runs beside it, median of the rounds. It backs `idem bench` and the
// Go benchmarks, and creates and drops tables of its own.
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
	Path        string    // bare, floor, fresh, read, replay, cross, retry, claim or hot
	Concurrency int       // concurrent workers, each with its own transaction
	TxPerSec    float64   // committed transactions per second, median of the rounds
	Ratio       float64   // TxPerSec over the bare transaction's in the same round, median of the rounds
	Rates       []float64 // transactions per second in each run (bare runs beside every other path, floor and read beside the paths they are the floor of)
	Ratios      []float64 // the ratio in each round

	// Floor is the path this one is held against besides bare: "floor"
	// for fresh, "read" for replay, cross, retry and hot; empty for the
	// others.
	Floor       string
	FloorRatio  float64   // TxPerSec over the floor's in the same round, median of the rounds
	FloorRatios []float64 // that ratio in each round
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
	// floor names the path that is this one's floor: the cheapest
	// hand-written transaction that does its job. It runs beside this
	// path, on the other side from the bare run.
	floor string
	// baseline paths run only beside the paths they are the floor of.
	baseline bool
}

// replayKey is the completed key worker w replays.
func replayKey(w int) string { return fmt.Sprintf("replay-%d", w) }

const hotKey = "hot"

// paths are what the benchmark runs, in the order of its table; the first,
// bare, is the baseline of every ratio.
var paths = []path{
	{name: "bare", worker: func(e *Env, _ int) func(context.Context) error { return e.Bare }},
	{name: "floor", baseline: true, worker: func(e *Env, _ int) func(context.Context) error { return e.Floor }},
	{name: "fresh", floor: "floor", worker: func(e *Env, _ int) func(context.Context) error { return e.Fresh }},
	{name: "read", baseline: true, worker: func(e *Env, w int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Read(ctx, replayKey(w)) }
	}},
	{name: "replay", floor: "read", worker: func(e *Env, w int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Do(ctx, replayKey(w), true) }
	}},
	{name: "cross", floor: "read", worker: func(e *Env, w int) func(context.Context) error { return e.crossReplayer(w, false) }},
	{name: "retry", floor: "read", worker: func(e *Env, w int) func(context.Context) error { return e.crossReplayer(w, true) }},
	{name: "claim", worker: func(e *Env, _ int) func(context.Context) error { return e.Claim }},
	{name: "hot", hot: true, floor: "read", worker: func(e *Env, _ int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Do(ctx, hotKey, true) }
	}},
}

// pathNamed is the path of that name.
func pathNamed(name string) path {
	i := slices.IndexFunc(paths, func(p path) bool { return p.name == name })
	return paths[i]
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
	path        path
	conc        int
	rates       []float64
	ratios      []float64 // to bare
	floorRatios []float64 // to the path's floor
}

// at is a path at a concurrency: the key of a baseline's cell.
type at struct {
	path string
	conc int
}

func run(ctx context.Context, e *Env, cfg Config, w io.Writer) (Report, error) {
	rep := Report{Driver: cfg.Driver, Dialect: cfg.Dialect.Name(), Rounds: cfg.Rounds}
	if err := e.Seed(ctx, max(slices.Max(cfg.Concurrency), cfg.HotWorkers)); err != nil {
		return rep, err
	}
	fmt.Fprintf(w, "idem bench: %s driver, %s dialect; %d rounds, each path for %v beside a bare run (and its floor's) of %v\n",
		cfg.Driver, rep.Dialect, cfg.Rounds, cfg.Duration, cfg.Duration)

	var cells []*cell
	baselines := map[at]*cell{}
	baseline := func(name string, conc int) *cell {
		k := at{name, conc}
		if baselines[k] == nil {
			baselines[k] = &cell{path: pathNamed(name), conc: conc}
		}
		return baselines[k]
	}
	for _, c := range cfg.Concurrency {
		for _, p := range paths[1:] {
			if !p.hot && !p.baseline {
				cells = append(cells, &cell{path: p, conc: c})
			}
		}
	}
	for _, p := range paths {
		if p.hot {
			cells = append(cells, &cell{path: p, conc: cfg.HotWorkers})
		}
	}
	// runs are the cells of one step: the path between its bare run and
	// its floor's, or beside its bare run when it has no floor.
	runs := func(c *cell, bareFirst bool) []*cell {
		b := baseline("bare", c.conc)
		order := []*cell{b, c}
		if c.path.floor != "" {
			order = append(order, baseline(c.path.floor, c.conc))
		}
		if !bareFirst {
			slices.Reverse(order)
		}
		return order
	}
	// A short pass, not counted, opens the pool's connections and fills
	// the drivers' statement caches.
	for _, c := range cells {
		for _, o := range runs(c, true) {
			if _, err := measure(ctx, e, o.path, o.conc, cfg.Duration/5); err != nil {
				return rep, fmt.Errorf("bench: %s at concurrency %d: %w", o.path.name, o.conc, err)
			}
		}
	}
	// Each path runs right beside a bare run at the same concurrency, and
	// beside its floor's on the other side, in turn before and after each,
	// and the order of the paths rotates from round to round: load from
	// outside that changes over seconds then weighs on both sides of each
	// ratio alike.
	for round := range cfg.Rounds {
		for _, st := range schedule(len(cells), round) {
			c := cells[st.cell]
			rate := map[*cell]float64{}
			for _, o := range runs(c, st.bareFirst) {
				r, err := measure(ctx, e, o.path, o.conc, cfg.Duration)
				if err != nil {
					return rep, fmt.Errorf("bench: %s at concurrency %d: %w", o.path.name, o.conc, err)
				}
				o.rates = append(o.rates, r)
				rate[o] = r
			}
			b := baseline("bare", c.conc)
			c.ratios = append(c.ratios, rate[c]/rate[b])
			if c.path.floor != "" {
				f := baseline(c.path.floor, c.conc)
				c.floorRatios = append(c.floorRatios, rate[c]/rate[f])
				f.ratios = append(f.ratios, rate[f]/rate[b])
			}
		}
	}
	concs := map[int]bool{}
	for _, c := range cells {
		concs[c.conc] = true
	}
	for _, conc := range slices.Sorted(maps.Keys(concs)) {
		b := baseline("bare", conc)
		rep.Results = append(rep.Results, Result{Path: "bare", Concurrency: conc, TxPerSec: median(b.rates), Ratio: 1, Rates: b.rates, Ratios: slices.Repeat([]float64{1}, len(b.rates))})
		for _, p := range paths[1:] {
			if p.baseline {
				if f := baselines[at{p.name, conc}]; f != nil {
					rep.Results = append(rep.Results, Result{Path: p.name, Concurrency: conc, TxPerSec: median(f.rates), Ratio: median(f.ratios), Rates: f.rates, Ratios: f.ratios})
				}
				continue
			}
			for _, c := range cells {
				if c.conc != conc || c.path.name != p.name {
					continue
				}
				r := Result{Path: p.name, Concurrency: conc, TxPerSec: median(c.rates), Ratio: median(c.ratios), Rates: c.rates, Ratios: c.ratios}
				if p.floor != "" {
					r.Floor, r.FloorRatio, r.FloorRatios = p.floor, median(c.floorRatios), c.floorRatios
				}
				rep.Results = append(rep.Results, r)
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
// before the cell's own run (and its floor's after it).
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
// returns committed transactions per second. The workers are made before
// the clock starts.
func measure(ctx context.Context, e *Env, p path, conc int, d time.Duration) (float64, error) {
	rates, err := measureTogether(ctx, e, []path{p}, conc, d)
	if err != nil {
		return 0, err
	}
	return rates[0], nil
}

// measureTogether runs conc workers of each of ps at the same time, for
// d, each at least once, and returns the committed operations per second
// of each: paths measured side by side meet the same load from outside
// (a checkpoint, another process), so the ratio of their rates moves
// less from one run to the next than that of rates measured in turn.
func measureTogether(ctx context.Context, e *Env, ps []path, conc int, d time.Duration) ([]float64, error) {
	var (
		done  = make([]atomic.Int64, len(ps))
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type loop struct {
		path int
		body func(context.Context) error
	}
	var loops []loop
	for i, p := range ps {
		for w := range conc {
			loops = append(loops, loop{i, p.worker(e, i*conc+w)})
		}
	}
	start := time.Now()
	deadline := start.Add(d)
	for _, l := range loops {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := l.body(ctx); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					cancel()
					return
				}
				done[l.path].Add(1)
				if !time.Now().Before(deadline) {
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	elapsed := time.Since(start).Seconds()
	rates := make([]float64, len(ps))
	for i := range rates {
		rates[i] = float64(done[i].Load()) / elapsed
	}
	return rates, nil
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
	fmt.Fprintln(tw, "path\tworkers\ttx/s\tratio to bare\tratio range\tfloor\tratio to floor\tratio range\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f-%.2f\t", r.Path, r.Concurrency, r.TxPerSec, r.Ratio, slices.Min(r.Ratios), slices.Max(r.Ratios))
		if r.Floor == "" {
			fmt.Fprint(tw, "\t\t\t\n")
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f-%.2f\t\n", r.Floor, r.FloorRatio, slices.Min(r.FloorRatios), slices.Max(r.FloorRatios))
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
