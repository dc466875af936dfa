package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// cacheCounts counts the replay cache's events a Store reports.
type cacheCounts struct{ hits, misses, evicted atomic.Int64 }

func (c *cacheCounts) Observe(_ context.Context, ev idem.Event) {
	switch ev.Kind {
	case idem.EventCacheHit:
		c.hits.Add(1)
	case idem.EventCacheMiss:
		c.misses.Add(1)
	case idem.EventCacheEvicted:
		c.evicted.Add(ev.Rows)
	}
}

// cached is a Store with a replay cache of bound, on a table of its own,
// and its cache's counts.
func (e *env) cached(bound idem.ReplayCache, opts ...idem.Option) (*store, *cacheCounts) {
	counts := new(cacheCounts)
	return e.store(append([]idem.Option{idem.WithReplayCache(bound), idem.WithObserver(counts)}, opts...)...), counts
}

// TestReplayCache: with the replay cache on, a replay of a record this
// process completed is answered without a statement, and nothing else
// changes: a request with another payload or operation is ErrMismatch, a
// record whose retention passed is never replayed from the cache (the
// database decides: the key runs again, or is ErrExpired with a key
// memory), a Store that has not seen the record (another instance) reads
// the database, a storm of duplicates still runs fn once, and the bound
// holds under 16 workers.
func testReplayCache(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		t.Run("hit", func(t *testing.T) {
			e := e.in(t)
			s, counts := e.cached(idem.ReplayCache{MaxEntries: 16})
			o, req := e.op(), charge("cached", "100")
			first, err := o.do(s, req)
			must(t, err)
			var (
				res idem.Result
				n   *atomic.Int64
			)
			must(t, runTx(ctx, e.db, nil, func(tx txn) error {
				tx, n = counted(tx)
				var err error
				res, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
				return err
			}))
			if !res.Replayed || string(res.Body) != string(first.Body) || n.Load() != 0 || counts.hits.Load() != 1 {
				t.Fatalf("replay: %+v after %q, %d statements, %d hits; want the first response, no statement, one hit", res, first.Body, n.Load(), counts.hits.Load())
			}
			other := req
			other.Fingerprint = idem.Fingerprint([]byte("amount=200"))
			must(t, runTx(ctx, e.db, nil, func(tx txn) error {
				tx, n = counted(tx)
				_, err = s.Do(ctx, tx, other, o.fn(tx, other.Key))
				return nil
			}))
			if !errors.Is(err, idem.ErrMismatch) || n.Load() != 0 {
				t.Fatalf("another payload: %v after %d statements, want ErrMismatch from the cache", err, n.Load())
			}
			other = req
			other.Operation = "POST /v1/refunds"
			if _, ok, err := s.Cached(ctx, other); !ok || !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("another operation: %v, %v; want ErrMismatch", ok, err)
			}
			if c := o.calls.Load(); c != 1 || e.count(o.biz, req.Key) != 1 {
				t.Fatalf("fn ran %d times, %d business rows; want 1", c, e.count(o.biz, req.Key))
			}
		})

		t.Run("retention", func(t *testing.T) {
			e := e.in(t)
			const retention = 600 * time.Millisecond
			s, counts := e.cached(idem.ReplayCache{MaxEntries: 16}, idem.WithKeyMemory(time.Hour))
			o := e.op()
			forgotten, remembered := charge("cached-forgotten", "100"), charge("cached-remembered", "100")
			forgotten.Retention, remembered.Retention = retention, retention
			other := forgotten
			other.Fingerprint = idem.Fingerprint([]byte("amount=200"))
			for _, req := range []idem.Request{forgotten, remembered} {
				_, err := o.do(s, req)
				must(t, err)
				if res, err := o.do(s, req); err != nil || !res.Replayed {
					t.Fatalf("%s within its retention: %+v, %v; want a replay", req.Key, res, err)
				}
			}
			if h := counts.hits.Load(); h != 2 {
				t.Fatalf("%d hits within retention, want 2", h)
			}
			time.Sleep(retention)
			if _, err := o.do(s, remembered); !errors.Is(err, idem.ErrExpired) {
				t.Fatalf("the same request past its retention, with a key memory: %v, want ErrExpired", err)
			}
			if _, err := o.do(s, other); !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("another request past its retention, with a key memory: %v, want ErrMismatch", err)
			}
			e.age(s, forgotten.Key, time.Hour+time.Minute) // past the key memory
			if res, err := o.do(s, forgotten); err != nil || res.Replayed {
				t.Fatalf("past its retention and key memory: %+v, %v; want fn to run again", res, err)
			}
			if h := counts.hits.Load(); h != 2 {
				t.Fatalf("%d hits, want 2: a record past its retention was replayed from the cache", h)
			}
			if c, rows := o.calls.Load(), e.count(o.biz, forgotten.Key); c != 3 || rows != 2 {
				t.Fatalf("fn ran %d times, %d business rows for the forgotten key; want 3 and 2", c, rows)
			}
		})

		t.Run("another instance", func(t *testing.T) {
			e := e.in(t)
			s, _ := e.cached(idem.ReplayCache{MaxEntries: 16})
			counts := new(cacheCounts)
			other := e.elsewhere(s, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 16}), idem.WithObserver(counts))
			o, req := e.op(), charge("cached-elsewhere", "100")
			first, err := o.do(s, req)
			must(t, err)
			for i := range 3 {
				res, err := o.do(other, req)
				if err != nil || !res.Replayed || string(res.Body) != string(first.Body) {
					t.Fatalf("replay %d in another instance: %+v, %v; want %q", i, res, err, first.Body)
				}
			}
			// The first replay reads the database (a miss), and the key is
			// known completed; the second reads it completed, and caches it;
			// the third is a hit.
			if m, h := counts.misses.Load(), counts.hits.Load(); m != 2 || h != 1 {
				t.Fatalf("another instance: %d misses, %d hits; want 2 and 1", m, h)
			}
			if c := o.calls.Load(); c != 1 || e.count(o.biz, req.Key) != 1 {
				t.Fatalf("fn ran %d times; want 1", c)
			}
		})

		t.Run("storm", func(t *testing.T) {
			e := e.in(t)
			const workers = 32
			s, counts := e.cached(idem.ReplayCache{MaxEntries: 16})
			o, req := e.op(), charge("cached-storm", "100")
			storm := func(n int) (executed, replayed int) {
				var (
					wg   sync.WaitGroup
					mu   sync.Mutex
					errs []error
				)
				start := make(chan struct{})
				for range n {
					wg.Go(func() {
						<-start
						res, err := e.do(s, req, func(tx handle) func(context.Context) (idem.Response, error) {
							return func(ctx context.Context) (idem.Response, error) {
								time.Sleep(50 * time.Millisecond)
								return o.fn(tx, req.Key)(ctx)
							}
						})
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case res.Replayed:
							replayed++
						default:
							executed++
						}
					})
				}
				close(start)
				wg.Wait()
				for _, err := range errs {
					t.Errorf("worker: %v", err)
				}
				return executed, replayed
			}
			if x, r := storm(workers); x != 1 || r != workers-1 {
				t.Fatalf("storm: executed %d, replayed %d; want 1 and %d", x, r, workers-1)
			}
			hits := counts.hits.Load()
			if x, r := storm(16); x != 0 || r != 16 || counts.hits.Load() != hits+16 {
				t.Fatalf("a storm after the commit: executed %d, replayed %d, %d hits; want 16 replays from the cache", x, r, counts.hits.Load()-hits)
			}
			if n := e.count(o.biz, req.Key); n != 1 || o.calls.Load() != 1 {
				t.Fatalf("%d business rows, fn ran %d times; want exactly 1", n, o.calls.Load())
			}
		})

		t.Run("bound", func(t *testing.T) {
			e := e.in(t)
			const workers, each, bound = 16, 4, 8
			s, counts := e.cached(idem.ReplayCache{MaxEntries: bound})
			o := e.op()
			key := func(w, i int) string { return fmt.Sprintf("cached-bound-%d-%d", w, i) }
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				errs []error
			)
			for w := range workers {
				wg.Go(func() {
					for i := range each {
						for range 2 { // the fresh request, and its replay
							if _, err := o.do(s, charge(key(w, i), "100")); err != nil {
								mu.Lock()
								errs = append(errs, err)
								mu.Unlock()
							}
						}
					}
				})
			}
			wg.Wait()
			for _, err := range errs {
				t.Errorf("worker: %v", err)
			}
			held := 0
			for w := range workers {
				for i := range each {
					if _, ok, _ := s.Cached(ctx, charge(key(w, i), "100")); ok {
						held++
					}
					if n := e.count(o.biz, key(w, i)); n != 1 {
						t.Fatalf("%s: %d business rows, want 1", key(w, i), n)
					}
				}
			}
			if held == 0 || held > bound || counts.evicted.Load() < workers*each-bound {
				t.Fatalf("%d entries held, %d evicted; want 1..%d held and at least %d evicted", held, counts.evicted.Load(), bound, workers*each-bound)
			}
		})
	})
}

// TestHTTPReplayCache: through idemhttp with the replay cache on, a
// replay is answered from the cache, marked replayed, and a request with
// another payload is 422, as without it.
func testHTTPReplayCache(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, counts := e.cached(idem.ReplayCache{MaxBytes: 1 << 20})
		api := e.chargeAPI()
		srv, _ := e.serve(idemhttp.Config{Store: s.Store}, api)
		c := srv.Client()
		first, err := post(c, srv.URL+"/v1/charges", `{"amount": 1}`, "cached-http")
		must(t, err)
		if first.status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		again, err := post(c, srv.URL+"/v1/charges", `{"amount": 1}`, "cached-http")
		must(t, err)
		if !again.replayed() || again.status != first.status || string(again.body) != string(first.body) || counts.hits.Load() != 1 {
			t.Fatalf("replay: %d %s replayed %v, %d hits; want the first answer from the cache", again.status, again.body, again.replayed(), counts.hits.Load())
		}
		other, err := post(c, srv.URL+"/v1/charges", `{"amount": 2}`, "cached-http")
		must(t, err)
		if other.status != http.StatusUnprocessableEntity || counts.hits.Load() != 2 {
			t.Fatalf("another payload: %d %s, %d hits; want 422 from the cache", other.status, other.body, counts.hits.Load())
		}
		if n := api.calls.Load(); n != 1 || e.count(api.biz, "cached-http") != 1 {
			t.Fatalf("the handler ran %d times; want 1", n)
		}
	})
}
