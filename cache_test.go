package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// cacheEnv is a SQLite database with a Store that has a replay cache,
// and the events its Observer received, by kind.
type cacheEnv struct {
	t      *testing.T
	db     *sql.DB
	store  *idem.Store
	events sync.Map // idem.EventKind -> *atomic.Int64
	ran    atomic.Int64
}

func newCacheEnv(t *testing.T, opts ...idem.Option) *cacheEnv {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "c.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := &cacheEnv{t: t, db: db}
	opts = append([]idem.Option{idem.WithObserver(idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		n, _ := e.events.LoadOrStore(ev.Kind, new(atomic.Int64))
		d := int64(1)
		if ev.Kind == idem.EventCacheEvicted {
			d = ev.Rows
		}
		n.(*atomic.Int64).Add(d)
	}))}, opts...)
	if e.store, err = idem.New(idem.SQLite, opts...); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *cacheEnv) count(k idem.EventKind) int64 {
	if n, ok := e.events.Load(k); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func cacheReq(key, fp string) idem.Request {
	return idem.Request{Scope: "s", Key: key, Operation: "POST /c", Fingerprint: fp}
}

// do runs req through Do in RunTx, a transaction idem runs and tracks.
func (e *cacheEnv) do(req idem.Request) (idem.Result, error) {
	var res idem.Result
	err := idem.RunTx(e.t.Context(), e.db, nil, func(tx *sql.Tx) error {
		var err error
		res, err = e.store.Do(e.t.Context(), tx, req, e.fn(req.Key))
		return err
	})
	return res, err
}

func (e *cacheEnv) fn(key string) func(context.Context) (idem.Response, error) {
	return func(context.Context) (idem.Response, error) {
		e.ran.Add(1)
		return idem.Response{StatusCode: 201, Header: map[string][]string{"X-Key": {key}}, Body: []byte("body of " + key)}, nil
	}
}

func TestReplayCacheOptions(t *testing.T) {
	for _, c := range []idem.ReplayCache{{}, {MaxEntries: -1}, {MaxBytes: -1, MaxEntries: 3}} {
		if _, err := idem.New(idem.SQLite, idem.WithReplayCache(c)); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := idem.New(idem.SQLite, idem.WithReplayCache(idem.ReplayCache{MaxBytes: 1 << 20})); err != nil {
		t.Error(err)
	}
}

// A replay of a record this process completed is answered without a
// statement: the table is gone, and the replay still comes, byte for
// byte; a request with another fingerprint is ErrMismatch from the cache.
func TestReplayCacheHitNeedsNoDatabase(t *testing.T) {
	e := newCacheEnv(t, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 10}))
	if _, err := e.do(cacheReq("k", "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec("DROP TABLE " + idem.DefaultTable); err != nil {
		t.Fatal(err)
	}
	res, err := e.do(cacheReq("k", "a"))
	if err != nil || !res.Replayed || res.StatusCode != 201 || string(res.Body) != "body of k" || res.Header.Get("X-Key") != "k" {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	res.Body[0], res.Header["X-Key"][0] = 'X', "changed" // the caller's copy, not the cache's
	if res, ok, err := e.store.Cached(t.Context(), cacheReq("k", "a")); !ok || err != nil || string(res.Body) != "body of k" || res.Header.Get("X-Key") != "k" {
		t.Fatalf("Cached: %+v, %v, %v", res, ok, err)
	}
	if _, err := e.do(cacheReq("k", "b")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("another fingerprint: %v, want ErrMismatch", err)
	}
	if _, ok, err := e.store.Cached(t.Context(), idem.Request{Scope: "s", Key: "k", Operation: "DELETE /c", Fingerprint: "a"}); !ok || !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("another operation: %v, %v, want ErrMismatch", ok, err)
	}
	if n := e.ran.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	if h, r, mm := e.count(idem.EventCacheHit), e.count(idem.EventReplayed), e.count(idem.EventMismatch); h != 4 || r != 2 || mm != 2 {
		t.Fatalf("events: %d hits, %d replayed, %d mismatches; want 4, 2, 2", h, r, mm)
	}
}

// A completion whose transaction rolled back never enters the cache, nor
// does one in a caller's transaction that is not tracked; a tracked one
// does once committed.
func TestReplayCacheOnlyCommitted(t *testing.T) {
	e := newCacheEnv(t, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 10}))
	ctx := t.Context()
	rollback := errors.New("the caller rolls back")
	err := idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
		if _, err := e.store.Do(ctx, tx, cacheReq("r", "a"), e.fn("r")); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if _, ok, _ := e.store.Cached(ctx, cacheReq("r", "a")); ok {
		t.Fatal("a rolled back completion is cached")
	}
	own := func(key string, tracked bool) {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		end := func(error) {}
		if tracked {
			end = idem.TrackCommit(tx)
		}
		if _, err := e.store.Do(ctx, tx, cacheReq(key, "a"), e.fn(key)); err != nil {
			t.Fatal(err)
		}
		err = tx.Commit()
		end(err)
		if err != nil {
			t.Fatal(err)
		}
	}
	own("untracked", false)
	if _, ok, _ := e.store.Cached(ctx, cacheReq("untracked", "a")); ok {
		t.Fatal("a completion in an untracked transaction is cached")
	}
	own("tracked", true)
	if res, ok, err := e.store.Cached(ctx, cacheReq("tracked", "a")); !ok || err != nil || !res.Replayed {
		t.Fatalf("tracked: %+v, %v, %v", res, ok, err)
	}
	// The untracked record, read completed in a transaction idem runs,
	// enters the cache then.
	for range 2 { // the first replay learns the key is completed; the second reads it so
		if res, err := e.do(cacheReq("untracked", "a")); err != nil || !res.Replayed {
			t.Fatalf("replay: %+v, %v", res, err)
		}
	}
	if _, ok, _ := e.store.Cached(ctx, cacheReq("untracked", "a")); !ok {
		t.Fatal("a record read completed is not cached")
	}
	if n := e.ran.Load(); n != 3 {
		t.Fatalf("fn ran %d times, want 3", n)
	}
}

// An entry never outlives its record's retention (the request's): past
// it the database decides, and the key, forgotten, runs again.
func TestReplayCacheEndsWithRetention(t *testing.T) {
	e := newCacheEnv(t, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 10}))
	req := cacheReq("short", "a")
	req.Retention = 300 * time.Millisecond
	if _, err := e.do(req); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := e.store.Cached(t.Context(), req); !ok {
		t.Fatal("not cached within its retention")
	}
	time.Sleep(req.Retention)
	if _, ok, _ := e.store.Cached(t.Context(), req); ok {
		t.Fatal("cached past its retention")
	}
	if res, err := e.do(req); err != nil || res.Replayed {
		t.Fatalf("past retention: %+v, %v; want fn to run again", res, err)
	}
	if n := e.ran.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2", n)
	}
}

// The bound holds, by count and by bytes, with the least recently used
// evicted first, under 16 workers.
func TestReplayCacheBound(t *testing.T) {
	for _, c := range []idem.ReplayCache{{MaxEntries: 8}, {MaxBytes: 8 * (idem.CacheEntryOverhead + 100)}} {
		t.Run(fmt.Sprintf("%d entries %d bytes", c.MaxEntries, c.MaxBytes), func(t *testing.T) {
			e := newCacheEnv(t, idem.WithReplayCache(c))
			var wg sync.WaitGroup
			errs := make(chan error, 16*8)
			for w := range 16 {
				wg.Go(func() {
					for i := range 8 {
						key := fmt.Sprintf("w%d-%d", w, i)
						if _, err := e.do(cacheReq(key, "a")); err != nil {
							errs <- err
						}
						if _, err := e.do(cacheReq(key, "a")); err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			held := 0
			for w := range 16 {
				for i := range 8 {
					if _, ok, _ := e.store.Cached(t.Context(), cacheReq(fmt.Sprintf("w%d-%d", w, i), "a")); ok {
						held++
					}
				}
			}
			if held == 0 || held > 8 {
				t.Fatalf("%d entries held, want 1..8", held)
			}
			if ev := e.count(idem.EventCacheEvicted); ev < int64(16*8-8) {
				t.Fatalf("%d evictions, want at least %d", ev, 16*8-8)
			}
			if n := e.ran.Load(); n != 16*8 {
				t.Fatalf("fn ran %d times, want %d", n, 16*8)
			}
		})
	}
}

// A sealed response stays sealed in the cache unless KeepOpened: both
// replay it in the clear.
func TestReplayCacheSealed(t *testing.T) {
	sealer, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	for _, opened := range []bool{false, true} {
		e := newCacheEnv(t, idem.WithSealer(sealer), idem.WithReplayCache(idem.ReplayCache{MaxEntries: 4, KeepOpened: opened}))
		if _, err := e.do(cacheReq("sealed", "a")); err != nil {
			t.Fatal(err)
		}
		res, ok, err := e.store.Cached(t.Context(), cacheReq("sealed", "a"))
		if !ok || err != nil || string(res.Body) != "body of sealed" || res.Header.Get("X-Key") != "sealed" {
			t.Fatalf("opened %v: %+v, %v, %v", opened, res, ok, err)
		}
	}
}

// refusing is a Sealer that refuses to open while refuse is set, as one
// whose key was retired after a Reseal refuses what that key sealed.
type refusing struct {
	idem.Sealer
	refuse atomic.Bool
}

func (r *refusing) Open(ciphertext, additional []byte) ([]byte, error) {
	if r.refuse.Load() {
		return nil, errors.New("the key is retired")
	}
	return r.Sealer.Open(ciphertext, additional)
}

// A sealed entry the sealer can no longer open is dropped, and the
// request goes to the database, which decides.
func TestReplayCacheSealedUnopenable(t *testing.T) {
	aes, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	sealer := &refusing{Sealer: aes}
	e := newCacheEnv(t, idem.WithSealer(sealer), idem.WithReplayCache(idem.ReplayCache{MaxEntries: 4}))
	req := cacheReq("retired", "a")
	if _, err := e.do(req); err != nil {
		t.Fatal(err)
	}
	sealer.refuse.Store(true)
	if _, ok, err := e.store.Cached(t.Context(), req); ok || err != nil {
		t.Fatalf("Cached of an entry the sealer cannot open: %v, %v; want a miss", ok, err)
	}
	if _, err := e.do(req); err == nil {
		t.Fatal("Do read a record the sealer cannot open, and did not fail")
	}
	sealer.refuse.Store(false)
	if _, ok, _ := e.store.Cached(t.Context(), req); ok {
		t.Fatal("the entry the sealer could not open is still cached")
	}
	if res, err := e.do(req); err != nil || !res.Replayed || e.ran.Load() != 1 {
		t.Fatalf("replay from the database: %+v, %v, fn ran %d times", res, err, e.ran.Load())
	}
}

// TrackCommit inside a transaction idem runs changes nothing: an end
// called before the commit does not put the completion in the cache
// early, and RunTx's rollback keeps it out.
func TestTrackCommitInsideRunTx(t *testing.T) {
	e := newCacheEnv(t, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 4}))
	ctx := t.Context()
	req := cacheReq("nested", "a")
	rollback := errors.New("roll back")
	err := idem.RunTx(ctx, e.db, nil, func(tx *sql.Tx) error {
		end := idem.TrackCommit(tx)
		if _, err := e.store.Do(ctx, tx, req, e.fn(req.Key)); err != nil {
			return err
		}
		end(nil)
		if _, ok, _ := e.store.Cached(ctx, req); ok {
			t.Error("cached before the commit")
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if _, ok, _ := e.store.Cached(ctx, req); ok {
		t.Fatal("a rolled back completion is cached")
	}
}
