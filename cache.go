package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ReplayCache bounds the replay cache of [WithReplayCache]: at least one
// of MaxEntries and MaxBytes must be positive; with both, both hold.
type ReplayCache struct {
	// MaxEntries is how many completed records the cache holds at most;
	// 0: no bound by count.
	MaxEntries int
	// MaxBytes is how many bytes the cache's entries take at most, each
	// counted as its scope, key, operation, fingerprint, header and body
	// plus [CacheEntryOverhead]; 0: no bound by size. A response larger
	// than the bound is never cached.
	MaxBytes int64
	// KeepOpened holds the responses of a Store [WithSealer] opened in
	// memory, so that a hit does not open them again. Off by default: the
	// cache then holds them sealed, as the table does, and a hit opens its
	// copy (no round trip, but the sealer's cost); one the sealer can no
	// longer open (its key retired after [Store.Reseal]) is dropped, and
	// the request goes to the database. The cache is the
	// process's memory: a heap dump or a core file holds what it holds,
	// and with KeepOpened that is the responses in the clear.
	KeepOpened bool
}

// CacheEntryOverhead is what MaxBytes counts of a cache entry beside its
// strings, header and body: the entry, its place in the map and in the
// recency list, measured (internal/bench, TestCacheMemory).
const CacheEntryOverhead = 512

// configureCache checks the bound of the Store's cache, if any, and
// readies it.
func (s *Store) configureCache() error {
	c := s.cache
	if c == nil {
		return nil
	}
	switch {
	case c.cfg.MaxEntries < 0 || c.cfg.MaxBytes < 0:
		return fmt.Errorf("idem: WithReplayCache: bounds must not be negative, got %d entries and %d bytes", c.cfg.MaxEntries, c.cfg.MaxBytes)
	case c.cfg.MaxEntries == 0 && c.cfg.MaxBytes == 0:
		return errors.New("idem: WithReplayCache needs a bound: MaxEntries, MaxBytes or both")
	}
	c.entries = make(map[string]*cacheEntry)
	c.root.prev, c.root.next = &c.root, &c.root
	cachesOn.Store(true)
	return nil
}

// replayCache is a Store's cache of completed records: a map by scope and
// key, and a list by recency (root.next the most recent).
type replayCache struct {
	cfg     ReplayCache
	mu      sync.Mutex
	entries map[string]*cacheEntry
	root    cacheEntry
	bytes   int64
}

// cacheEntry is a completed record in the cache. Its fields but the
// list's links are never changed once it is in: a hit copies them out.
type cacheEntry struct {
	id                     string // cacheID
	operation, fingerprint string
	deadline               time.Time // on the monotonic clock
	// resp is the response, in the clear; or, when sealed is not nil, its
	// status code alone, with the sealed record in sealed.
	resp       Response
	sealed     *keyRecord
	size       int64
	prev, next *cacheEntry
}

// cacheID is the cache's name for req's key. A scope holds no NUL.
func cacheID(req Request) string { return req.Scope + "\x00" + req.Key }

// life is how long the cache may hold a record whose expiry is d from a
// statement sent after the entry's clock was read: d less 1/64 of it and
// a millisecond, a margin for the two clocks' rates and for SQLite's
// millisecond clock.
func life(d time.Duration) time.Duration { return d - d/64 - time.Millisecond }

// get returns a copy of id's entry when it is there and within its
// deadline at now, and marks it the most recently used; an entry past
// its deadline is removed.
func (c *replayCache) get(id string, now time.Time) (cacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[id]
	if e == nil {
		return cacheEntry{}, false
	}
	if !now.Before(e.deadline) {
		c.remove(e)
		return cacheEntry{}, false
	}
	c.unlink(e)
	c.front(e)
	return *e, true
}

// put adds e, replacing an entry of its key, and returns how many entries
// it evicted to keep the bound. An entry larger than MaxBytes stays out.
func (c *replayCache) put(e *cacheEntry) (evicted int64) {
	if c.cfg.MaxBytes > 0 && e.size > c.cfg.MaxBytes {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[e.id]; old != nil {
		c.remove(old)
	}
	c.entries[e.id] = e
	c.bytes += e.size
	c.front(e)
	for c.cfg.MaxEntries > 0 && len(c.entries) > c.cfg.MaxEntries || c.cfg.MaxBytes > 0 && c.bytes > c.cfg.MaxBytes {
		c.remove(c.root.prev)
		evicted++
	}
	return evicted
}

// drop removes id's entry, if any.
func (c *replayCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[id]; e != nil {
		c.remove(e)
	}
}

// len returns how many entries and bytes the cache holds.
func (c *replayCache) len() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

func (c *replayCache) remove(e *cacheEntry) {
	c.unlink(e)
	delete(c.entries, e.id)
	c.bytes -= e.size
}

func (c *replayCache) unlink(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *replayCache) front(e *cacheEntry) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}

// Cached answers req from the Store's replay cache ([WithReplayCache]),
// without the database: ok reports that it answered, with the stored
// response to replay (Replayed true) or with an error ([ErrMismatch] for a
// request that differs from the record's). When ok is false, the cache
// holds no record of req's key within its deadline (or the Store has no
// cache): run the request as usual, with Do, which counts the miss. A
// caller that opens a transaction for Do calls it first, so that a hit
// opens none; the serving layers (idemhttp, idemgrpc, the consumer
// middleware) do. A hit is reported to the [Observer] as Do's would be
// ([EventReplayed] or [EventMismatch]), with an [EventCacheHit].
func (s *Store) Cached(ctx context.Context, req Request) (res Result, ok bool, err error) {
	if s.cache == nil {
		return Result{}, false, nil
	}
	start := startWatch()
	r, hit, err := s.fromCache(ctx, req, false)
	if !hit {
		return Result{}, false, nil
	}
	res = resultOf(r)
	s.observeDo(ctx, req, start, &res, &err)
	return res, true, err
}

// fromCache looks req's key up in the cache, and reports a hit, and a
// miss when countMiss: hit reports that the cache answered, with res or
// err.
func (s *Store) fromCache(ctx context.Context, req Request, countMiss bool) (res *Result, hit bool, err error) {
	if s.cache == nil {
		return nil, false, nil
	}
	id := cacheID(req)
	e, ok := s.cache.get(id, monotonic())
	var resp Response
	switch {
	case !ok:
	case e.operation != req.Operation || e.fingerprint != req.Fingerprint:
		s.observe(ctx, Event{Kind: EventCacheHit, Scope: req.Scope, Key: req.Key, Operation: req.Operation})
		return nil, true, mismatchError(req, keyRecord{operation: e.operation, fingerprint: e.fingerprint})
	case e.sealed != nil:
		var err error
		if resp, err = s.response(req, *e.sealed); err != nil {
			// Sealed with a key the sealer no longer has (Reseal, then
			// the old key retired): the database holds it resealed.
			s.cache.drop(id)
			ok = false
		}
	default:
		resp = cloneResponse(e.resp)
	}
	if !ok {
		if countMiss {
			s.observe(ctx, Event{Kind: EventCacheMiss, Scope: req.Scope, Key: req.Key, Operation: req.Operation})
		}
		return nil, false, nil
	}
	s.observe(ctx, Event{Kind: EventCacheHit, Scope: req.Scope, Key: req.Key, Operation: req.Operation})
	return &Result{Response: resp, Replayed: true}, true, nil
}

// resultOf is the Result of a cache hit: the replay, or none beside an
// error.
func resultOf(r *Result) Result {
	if r == nil {
		return Result{}
	}
	return *r
}

// monotonic is the application's clock, read for the replay cache alone:
// an entry's deadline is a moment before the statement that gave its
// record's expiry plus a duration the database gave (the time left, or
// the retention), and is only compared with another reading of this
// clock, never with a database time, so that only the monotonic clock's
// rate matters (life's margin covers it). See docs/semantics.md, The
// replay cache.
func monotonic() time.Time { return time.Now() }

// cloneResponse is a copy of r that shares no memory with it: the
// cache's entries are never handed out, so that a caller that changes a
// replayed header or body changes only its own.
func cloneResponse(r Response) Response {
	out := Response{StatusCode: r.StatusCode, Header: r.Header.Clone(), Reference: r.Reference}
	if r.Body != nil {
		out.Body = append(make([]byte, 0, len(r.Body)), r.Body...)
	}
	return out
}

// sizeOf is what MaxBytes counts of e.
func (e *cacheEntry) sizeOf() int64 {
	n := CacheEntryOverhead + 2*len(e.id) + len(e.operation) + len(e.fingerprint) + len(e.resp.Body)
	for k, vs := range e.resp.Header {
		n += len(k) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	if e.sealed != nil {
		n += len(e.sealed.body) + len(e.sealed.sealedKey.String)
	}
	return int64(n)
}

// WithReplayCache answers replays of completed records from this
// process's memory, without a round trip to the database: the cache holds
// up to c's bound of completed records, and evicts the least recently
// used first. Off by default. See docs/semantics.md, The replay cache.
//
// A record enters the cache only once it is known committed: when a
// transaction that completed it, or read it completed, commits, where
// idem knows of the commit: a transaction idem runs ([RunTx], [InTx],
// [InPipelinedTx], idempgx.RunTx, the serving layers idemhttp, idemgrpc
// and the consumer middleware, Begin's own), or a caller's own that it
// tracks with [TrackCommit]. A Do inside an untracked transaction of the
// caller's reads the cache but adds nothing to it: Do cannot know that
// the transaction committed, and a completion that was rolled back must
// never be replayed. A record in flight (a claim) never enters it.
//
// An entry lives no longer than its record's expiry (the request's
// Retention, else the Store's), counted conservatively on the
// application's monotonic clock from before the statement that set or
// read the expiry, minus 1/64 of it and a millisecond, so that the
// application's clock drifting from the database's cannot keep it past
// the record's: past its deadline the database decides, so that key
// memory, Purge and a key reused after its retention behave as without
// the cache. A hit whose Operation or Fingerprint differs from the
// record's is [ErrMismatch], as from the database.
//
// A hit answers Do (DoOn, Apply) without a statement, Begin without its
// transaction, and the serving layers (idemhttp, idemgrpc, the consumer
// middleware) without opening a transaction, through [Store.Cached]; a
// caller that opens its own transaction can call Cached before it.
// Hits, misses and evictions are reported to the [Observer]
// ([EventCacheHit], [EventCacheMiss], [EventCacheEvicted]).
//
// What the cache cannot see: a record deleted by hand before its expiry
// is still replayed by a process that holds it, until the entry's
// deadline; a database clock stepped forward by more than the margin
// ends a record sooner than the cache knows. Leave the cache off where
// records are deleted by hand while their keys may still be retried.
func WithReplayCache(c ReplayCache) Option {
	return func(s *Store) { s.cache = &replayCache{cfg: c} }
}

// cachesOn is set once a Store with a replay cache is made: from then on
// the transactions that idem runs are tracked, so that what they
// complete or read completed enters a cache when they commit.
var cachesOn atomic.Bool
