package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// manyKeys is how many completed keys the replays of BenchmarkReplayMany
// spread over: more than a run replays, so that the Store replaying them
// meets each key once (its completed-key hint never holds the key it
// replays), as a service replays keys it completed minutes ago, most of
// which have left the hint, or that another instance completed.
const manyKeys = 4096

// manyKey is the i-th key of BenchmarkReplayMany, completed in idem's
// table and in the floor's.
func manyKey(i int) string { return fmt.Sprintf("many-%d", i) }

// seedMany completes the manyKeys keys in idem's table (Do, through
// e.store) and in the floor's (floorOp), in workers workers at once.
func (e *Env) seedMany(ctx context.Context, workers int) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < manyKeys; i += workers {
				k := manyKey(i)
				if errs[w] = e.Do(ctx, k, false); errs[w] != nil {
					return
				}
				if errs[w] = e.tx(ctx, func(tx *sql.Tx) error { return e.floorOp(ctx, tx, k) }); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// manyOrder returns the keys of worker w: every one of the manyKeys keys
// once, in a random order of the worker's own, then again in another.
func manyOrder(w int) func() string {
	r := rand.New(rand.NewPCG(uint64(w), 44))
	var order []int
	return func() string {
		if len(order) == 0 {
			order = r.Perm(manyKeys)
		}
		k := manyKey(order[0])
		order = order[1:]
		return k
	}
}

// instance is another instance of the service, as the replays of
// BenchmarkReplayMany reach it: one Store on e's table that has not
// served the keys, shared by every worker, which replays each of the
// manyKeys keys once, in a random order, and is made anew (another
// instance again) once it has replayed them all.
type instance struct {
	e     *Env
	opts  []idem.Option // the Store's, beside its table
	mu    sync.Mutex
	s     *idem.Store
	order []int
	r     *rand.Rand
}

func (e *Env) instance(opts ...idem.Option) *instance {
	return &instance{e: e, opts: opts, r: rand.New(rand.NewPCG(44, 44))}
}

// next is the Store and the key of the next replay.
func (in *instance) next() (*idem.Store, string, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.order) == 0 {
		s, err := idem.New(in.e.dialect, append([]idem.Option{idem.WithTable(in.e.store.Table())}, in.opts...)...)
		if err != nil {
			return nil, "", fmt.Errorf("bench: %w", err)
		}
		in.s, in.order = s, in.r.Perm(manyKeys)
	}
	k := manyKey(in.order[0])
	in.order = in.order[1:]
	return in.s, k, nil
}

// replayer is a worker's replay of in's next key, saying it retries when
// hinted (idem.WithRetryHint).
func (in *instance) replayer(hinted bool) func(int) func(context.Context) error {
	return func(int) func(context.Context) error { return replayCross(in.next, hinted, in.e.doOn) }
}

// requestTimeout is the deadline of the context each operation of
// BenchmarkReplayMany runs in.
const requestTimeout = 30 * time.Second

// inRequest runs each operation of worker in a context of its own with a
// deadline, as a service's handler runs in its request's: database/sql
// then watches that context through each transaction and each result set
// (a goroutine each), which it does not for a context that cannot end.
func inRequest(worker func(int) func(context.Context) error) func(int) func(context.Context) error {
	return func(w int) func(context.Context) error {
		op := worker(w)
		return func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, requestTimeout)
			defer cancel()
			return op(ctx)
		}
	}
}

// manyReader is the one-read transaction on the floor's table of worker
// w's many keys, in the worker's random order.
func (e *Env) manyReader(w int) func(context.Context) error {
	next := manyOrder(w)
	return func(ctx context.Context) error { return e.Read(ctx, next()) }
}

// BenchmarkReplayMany measures the replay a service sees, on each driver
// at concurrency 16, beside the one-read transaction, in one run: the
// workers replay the manyKeys keys completed earlier, in a random order,
// through one Store that has not served them (an instance behind a load
// balancer that did not run the requests, or one whose completed-key
// hint no longer holds them), made before the first sub-benchmark and
// kept across them, as a service keeps its Store; and read the same keys
// in the floor's table, each worker in a random order of its own, in
// turn (cachePair: the mean time of each, base-ns and ns, and the
// speedup, the read's time over the replay's). other-instance sends the
// replays as a client that does not say it retries; other-instance-retry
// in a context that says so (idem.WithRetryHint), as idemhttp's is for
// idemclient's resends, through a Store of its own;
// other-instance-retry-lock-timeout the same through a Store with
// idem.WithLockTimeout, as docs/http.md and docs/grpc.md advise in
// transaction mode. fresh is a fresh Do beside the floor's hand-written
// transaction, the same way, and fresh-lock-timeout the same through a
// Store with WithLockTimeout. Each operation runs in a context with a
// deadline of its own (inRequest), as a service's handler does. A Store
// replays each key once; past manyKeys replays a new one takes over, so
// keep -benchtime times -count near 2 x manyKeys.
//
//	go test -run '^$' -bench BenchmarkReplayMany -benchtime 2000x -count 4 ./internal/bench
func BenchmarkReplayMany(b *testing.B) {
	ctx := context.Background()
	const conc = 16
	for _, tg := range targets {
		b.Run(tg.driver, func(b *testing.B) {
			e := seeded(b, tg.open(b), tg.dialect, 0)
			if err := e.seedMany(ctx, conc); err != nil {
				b.Fatal(err)
			}
			bound := idem.WithLockTimeout(2 * time.Second)
			unhinted, hinted, bounded := e.instance(), e.instance(), e.instance(bound)
			freshBounded, err := idem.New(tg.dialect, idem.WithTable(e.store.Table()), bound)
			if err != nil {
				b.Fatal(err)
			}
			for _, p := range []cachePair{
				{"other-instance", e.manyReader, unhinted.replayer(false)},
				{"other-instance-retry", e.manyReader, hinted.replayer(true)},
				{"other-instance-retry-lock-timeout", e.manyReader, bounded.replayer(true)},
				{"fresh",
					func(int) func(context.Context) error { return e.Floor },
					func(int) func(context.Context) error { return e.Fresh }},
				{"fresh-lock-timeout",
					func(int) func(context.Context) error { return e.Floor },
					func(int) func(context.Context) error {
						return func(ctx context.Context) error { return e.doOn(ctx, freshBounded, e.Key(), false) }
					}},
			} {
				p.base, p.of = inRequest(p.base), inRequest(p.of)
				b.Run(p.name, func(b *testing.B) { p.run(b, conc) })
			}
		})
	}
}
