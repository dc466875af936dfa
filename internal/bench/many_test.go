package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/idemkit/idem"
)

// manyKeys is how many completed keys the replays of BenchmarkReplayMany
// spread over: more than a run replays, so that each worker's Store
// replays each key once at most (its completed-key hint never holds the
// key it replays), as a service replays keys it completed minutes ago,
// most of which have left the hint, or that another instance completed.
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

// manyOrder returns worker w's keys: every one of the manyKeys keys once,
// in a random order of the worker's own, then again in another, and
// whether the turn starts again with this key.
func manyOrder(w int) func() (string, bool) {
	r := rand.New(rand.NewPCG(uint64(w), 44))
	var order []int
	return func() (string, bool) {
		turn := len(order) == 0
		if turn {
			order = r.Perm(manyKeys)
		}
		k := manyKey(order[0])
		order = order[1:]
		return k, turn
	}
}

// manyReplayer is worker w's replay of the many keys in its random order
// through a Store on e's table made before the run and anew at each turn
// (another instance's, which has not served the key), saying it retries
// when hinted (idem.WithRetryHint).
func (e *Env) manyReplayer(w int, hinted bool) func(context.Context) error {
	next := manyOrder(w)
	var s *idem.Store
	return replayCross(func() (*idem.Store, string, error) {
		key, turn := next()
		if turn {
			var err error
			if s, err = idem.New(e.dialect, idem.WithTable(e.store.Table())); err != nil {
				return nil, "", fmt.Errorf("bench: %w", err)
			}
		}
		return s, key, nil
	}, hinted, e.doOn)
}

// manyReader is the one-read transaction on the floor's table of worker
// w's many keys, in the worker's random order.
func (e *Env) manyReader(w int) func(context.Context) error {
	next := manyOrder(w + 16)
	return func(ctx context.Context) error {
		key, _ := next()
		return e.Read(ctx, key)
	}
}

// BenchmarkReplayMany measures the replay a service sees, on each driver
// at concurrency 16, beside the one-read transaction, in one run: each
// worker replays the manyKeys keys completed earlier in a random order
// of its own through a Store that has not served them (another instance,
// or one whose completed-key hint no longer holds them), and reads them
// in the floor's table in another random order, in turn (cachePair: the
// mean time of each, base-ns and ns, and the speedup, the read's time
// over the replay's). other-instance sends the replays as a client that
// does not say it retries; other-instance-retry in a context that says
// so (idem.WithRetryHint), as idemhttp's is for idemclient's resends.
// fresh is a fresh Do beside the floor's hand-written transaction, the
// same way.
//
//	go test -run '^$' -bench BenchmarkReplayMany -benchtime 3000x -count 5 ./internal/bench
func BenchmarkReplayMany(b *testing.B) {
	ctx := context.Background()
	const conc = 16
	for _, tg := range targets {
		b.Run(tg.driver, func(b *testing.B) {
			e := seeded(b, tg.open(b), tg.dialect, 0)
			if err := e.seedMany(ctx, conc); err != nil {
				b.Fatal(err)
			}
			for _, p := range []cachePair{
				{"other-instance", e.manyReader, func(w int) func(context.Context) error { return e.manyReplayer(w, false) }},
				{"other-instance-retry", e.manyReader, func(w int) func(context.Context) error { return e.manyReplayer(w, true) }},
				{"fresh",
					func(int) func(context.Context) error { return e.Floor },
					func(int) func(context.Context) error { return e.Fresh }},
			} {
				b.Run(p.name, func(b *testing.B) { p.run(b, conc) })
			}
		})
	}
}
