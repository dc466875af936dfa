package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// cacheBound is the replay cache of the benchmarks: room for every key
// they replay.
var cacheBound = idem.ReplayCache{MaxEntries: 1 << 16}

// cachedKeys is how many keys each worker of the same-instance path
// replays in turn.
const cachedKeys = 64

// cachedKey is the i-th key worker w completes and then replays through
// the Store with the cache.
func cachedKey(w, i int) string { return fmt.Sprintf("cached-%d-%d", w, i) }

// httpKey is the key worker w replays through the handler at path h.
func httpKey(h string, w int) string { return fmt.Sprintf("http%s-%d", h, w) }

// doCached is what a caller that runs its own transactions does with a
// replay cache: it asks the cache first (Store.Cached), so that a hit
// opens no transaction, and otherwise runs Do in RunTx, whose commit puts
// the record in the cache. It checks that the result is a replay exactly
// when replay is true.
func (e *Env) doCached(ctx context.Context, s *idem.Store, key string, replay bool) error {
	req := Request(key)
	res, ok, err := s.Cached(ctx, req)
	if !ok {
		err = idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
			var err error
			res, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
				return response, e.order(ctx, tx, key)
			})
			return err
		})
	}
	if err == nil && (res.Replayed != replay || res.StatusCode != response.StatusCode) {
		err = fmt.Errorf("bench: key %q: replayed=%v status=%d, want replayed=%v status=%d", key, res.Replayed, res.StatusCode, replay, response.StatusCode)
	}
	return err
}

// doInTx is Do in RunTx, without asking the cache first: a hit then
// skips the read, but not the transaction's BEGIN and COMMIT.
func (e *Env) doInTx(ctx context.Context, s *idem.Store, key string, replay bool) error {
	return idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
		res, err := s.Do(ctx, tx, Request(key), func(ctx context.Context) (idem.Response, error) {
			return response, e.order(ctx, tx, key)
		})
		if err == nil && res.Replayed != replay {
			err = fmt.Errorf("bench: key %q: replayed=%v, want %v", key, res.Replayed, replay)
		}
		return err
	})
}

// cachedHTTP serves idemhttp's middleware with s's replay cache at
// middlewarePath, and the bare handler (Do in RunTx, no cache) at
// barePath, on e's tables.
func (e *Env) cachedHTTP(tb testing.TB, s *idem.Store) string {
	tb.Helper()
	mw, err := idemhttp.New(idemhttp.Config{Store: s, DB: e.db, Scope: func(*http.Request) (string, error) { return "bench", nil }})
	if err != nil {
		tb.Fatal(err)
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
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// cachePair is a path measured beside the one it is compared with: each
// worker runs them in turn, so that both meet the same load.
type cachePair struct {
	name     string
	base, of func(w int) func(context.Context) error
}

// run runs p's two paths in turn in conc workers, and reports the mean
// time of each (base-ns and ns, in ns per operation, under the load of
// both) and their ratio, speedup: how many times faster p's path runs
// than its base.
func (p cachePair) run(b *testing.B, conc int) {
	var (
		next         atomic.Int64
		baseNs, ofNs atomic.Int64
		n            atomic.Int64
	)
	parallel(b, conc, func(int) func(context.Context) error {
		w := int(next.Add(1)-1) % conc
		base, of := p.base(w), p.of(w)
		flip := false
		return func(ctx context.Context) error {
			flip = !flip
			f, sum := base, &baseNs
			if flip {
				f, sum = of, &ofNs
			} else {
				n.Add(1)
			}
			start := time.Now()
			err := f(ctx)
			sum.Add(int64(time.Since(start)))
			return err
		}
	})
	if k := n.Load(); k > 0 {
		bn, on := float64(baseNs.Load())/float64(k), float64(ofNs.Load())/float64(k)
		b.ReportMetric(bn, "base-ns")
		b.ReportMetric(on, "ns")
		b.ReportMetric(bn/on, "speedup")
	}
}

// BenchmarkReplayCache measures the replay cache (idem.WithReplayCache)
// on each driver at concurrency 16, beside what it is compared with, in
// one run: each sub-benchmark runs its path and the one it is compared
// with in turn in each worker (cachePair), and reports the time of each
// and the speedup, the ratios of docs/benchmarks.md (The replay cache);
// -count gives the spread.
//
//	go test -run '^$' -bench BenchmarkReplayCache -benchtime 2s -count 5 ./internal/bench
//
// Beside the one-read transaction (BEGIN; SELECT; COMMIT on the floor's
// table): replay is Do replaying each worker's key without the cache, in
// a transaction of its own; hot-cached and same-instance-cached ask the
// cache first and run Do in RunTx on a miss (doCached), on one key for
// every worker and on 64 keys per worker that this process completed;
// hit-in-tx is Do in RunTx on a cached key, which skips the read but
// opens the transaction. fresh-cached runs new keys through doCached with
// the cache beside the same without it. http-cached-replay is idemhttp
// with the cache, replaying, beside a handler that calls Do in RunTx
// without the cache (bareHandler), replaying: both from 16 HTTP clients.
func BenchmarkReplayCache(b *testing.B) {
	ctx := context.Background()
	const conc = 16
	for _, tg := range targets {
		b.Run(tg.driver, func(b *testing.B) {
			e := seeded(b, tg.open(b), tg.dialect, conc)
			cached, err := idem.New(tg.dialect, idem.WithTable(e.store.Table()), idem.WithReplayCache(cacheBound))
			if err != nil {
				b.Fatal(err)
			}
			for w := range conc {
				for i := range cachedKeys {
					if err := e.doCached(ctx, cached, cachedKey(w, i), false); err != nil {
						b.Fatal(err)
					}
				}
			}
			for range 3 { // the hot key, completed by the Store without the cache: learnt, then read and cached
				if err := e.doInTx(ctx, cached, hotKey, true); err != nil {
					b.Fatal(err)
				}
			}
			url := e.cachedHTTP(b, cached)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}}
			b.Cleanup(client.CloseIdleConnections)
			for w := range conc {
				for _, h := range []string{middlewarePath, barePath} {
					if err := send(ctx, client, url+h, httpKey(h, w), false); err != nil {
						b.Fatal(err)
					}
				}
			}
			turn := func(f func(ctx context.Context, w, i int) error) func(w int) func(context.Context) error {
				return func(w int) func(context.Context) error {
					i := 0
					return func(ctx context.Context) error { i++; return f(ctx, w, i%cachedKeys) }
				}
			}
			read := func(w int) func(context.Context) error {
				return func(ctx context.Context) error { return e.Read(ctx, replayKey(w)) }
			}
			for _, p := range []cachePair{
				{"replay", read, func(w int) func(context.Context) error {
					return func(ctx context.Context) error { return e.Do(ctx, replayKey(w), true) }
				}},
				{"hot-cached", read, func(int) func(context.Context) error {
					return func(ctx context.Context) error { return e.doCached(ctx, cached, hotKey, true) }
				}},
				{"same-instance-cached", read, turn(func(ctx context.Context, w, i int) error { return e.doCached(ctx, cached, cachedKey(w, i), true) })},
				{"hit-in-tx", read, turn(func(ctx context.Context, w, i int) error { return e.doInTx(ctx, cached, cachedKey(w, i), true) })},
				{"fresh-cached",
					func(int) func(context.Context) error {
						return func(ctx context.Context) error { return e.doCached(ctx, e.store, e.Key(), false) }
					},
					func(int) func(context.Context) error {
						return func(ctx context.Context) error { return e.doCached(ctx, cached, e.Key(), false) }
					}},
				{"http-cached-replay",
					func(w int) func(context.Context) error {
						return func(ctx context.Context) error { return send(ctx, client, url+barePath, httpKey(barePath, w), true) }
					},
					func(w int) func(context.Context) error {
						return func(ctx context.Context) error {
							return send(ctx, client, url+middlewarePath, httpKey(middlewarePath, w), true)
						}
					}},
			} {
				b.Run(p.name, func(b *testing.B) { p.run(b, conc) })
			}
		})
	}
}
