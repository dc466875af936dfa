package idem

import (
	"context"
	"database/sql"
	"reflect"
	"sync"
	"time"
)

// conn is a Conn as the Store's dialect sends statements through it:
// with their arguments written into the text where lit says so
// (Dialect.literals), which is asked once per handle.
type conn struct {
	c   Conn
	lit func(Query) Query // nil: parameters
	// p is c as a Pipeline, where c is one and the dialect has the
	// statements a pipelined Do sends (its claimGone is not nil); else
	// nil.
	p Pipeline
	// commit is c's tracked commit, for the replay cache (cache.go); nil
	// when c is not tracked or the Store has no cache.
	commit *txCommit
}

// sent is q as the driver should be sent it.
func (c conn) sent(q Query) Query {
	if c.lit == nil {
		return q
	}
	return c.lit(q)
}

func (c conn) exec(ctx context.Context, q Query) (int64, error) { return c.c.Exec(ctx, c.sent(q)) }

func (c conn) queryRow(ctx context.Context, q Query, dest ...any) error {
	return c.c.QueryRow(ctx, c.sent(q), dest...)
}

func (c conn) queryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error {
	return c.c.QueryRows(ctx, c.sent(q), each)
}

// Exec, QueryRow and QueryRows make c a [Conn] that sends each statement
// as the dialect does, for the dialect's session hooks (checkSession,
// causalReads, boundLockWait).
func (c conn) Exec(ctx context.Context, q Query) (int64, error) { return c.exec(ctx, q) }

func (c conn) QueryRow(ctx context.Context, q Query, dest ...any) error {
	return c.queryRow(ctx, q, dest...)
}

func (c conn) QueryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error {
	return c.queryRows(ctx, q, each)
}

// conn is c as s's dialect sends statements through it.
func (s *Store) conn(c Conn) conn {
	sc := conn{c: c, lit: s.dialect.literals(c)}
	if s.dialect.claimGone() != nil {
		sc.p, _ = c.(Pipeline)
	}
	if s.cache != nil {
		sc.commit = committing(c)
	}
	return sc
}

// trackedCommits are the tracked transactions, by txID, each to its txCommit.
var trackedCommits sync.Map

// txCommit holds the cache entries of a tracked transaction until it
// ends: they enter their Stores' caches when it commits, and are
// dropped when it does not.
type txCommit struct {
	mu      sync.Mutex
	pending []pendingEntry
}

type pendingEntry struct {
	s *Store
	e *cacheEntry
}

func (tc *txCommit) add(s *Store, e *cacheEntry) {
	e.size = e.sizeOf()
	tc.mu.Lock()
	tc.pending = append(tc.pending, pendingEntry{s, e})
	tc.mu.Unlock()
}

// txID is the name of a transaction in commits: the handle of database/
// sql's, the Tx value of another driver's; ok is false for a value that
// cannot be a map key.
func txID(tx any) (id any, ok bool) {
	if t, isSQL := tx.(sqlTx); isSQL {
		tx = t.db
	}
	if tx == nil || !reflect.ValueOf(tx).Comparable() {
		return nil, false
	}
	return tx, true
}

// track starts tracking tx's commit, when a Store of the process has a
// cache and tx is not tracked already; nil otherwise. Its end must be
// called once tx has ended.
func track(tx any) *tracked {
	if !cachesOn.Load() {
		return nil
	}
	id, ok := txID(tx)
	if !ok {
		return nil
	}
	t := &tracked{id: id, tc: new(txCommit)}
	if _, already := trackedCommits.LoadOrStore(id, t.tc); already {
		return nil // tracked already (TrackCommit inside RunTx): its tracker ends it
	}
	return t
}

// tracked is a transaction in commits.
type tracked struct {
	id any
	tc *txCommit
}

// end stops tracking the transaction, and when it committed, puts its
// entries into their caches, reporting evictions on ctx.
func (t *tracked) end(ctx context.Context, committed bool) {
	if t == nil {
		return
	}
	trackedCommits.CompareAndDelete(t.id, t.tc)
	t.tc.mu.Lock()
	pending := t.tc.pending
	t.tc.pending = nil
	t.tc.mu.Unlock()
	if !committed {
		return
	}
	for _, p := range pending {
		if n := p.s.cache.put(p.e); n > 0 {
			p.s.observe(ctx, Event{Kind: EventCacheEvicted, Rows: n})
		}
	}
}

// committing is the txCommit of c when c is a tracked transaction.
func committing(c Conn) *txCommit {
	id, ok := txID(c)
	if !ok {
		return nil
	}
	if tc, ok := trackedCommits.Load(id); ok {
		return tc.(*txCommit)
	}
	return nil
}

// TrackCommit tracks the commit of tx, a database/sql transaction of the
// caller's, for the replay caches ([WithReplayCache]): what Do, Apply and
// [Claim.Complete] complete through tx, and what they read completed
// through it, enters the cache of its [Store] when the caller reports that
// tx committed, by calling end with the commit's error (nil: committed),
// and is dropped when it reports any other outcome. end must be called
// once tx has ended, committed or not; until then tx is held in a table
// of the process. Without it, a Do in a caller's transaction only reads
// the cache. The transactions that idem runs ([RunTx], [InTx], the
// serving layers) need none, and there it does nothing: their own
// tracking ends with their commit. When no [Store] of the process has a
// cache, it does nothing.
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	end := idem.TrackCommit(tx)
//	res, err := store.Do(ctx, tx, req, fn)
//	...
//	err = tx.Commit()
//	end(err)
func TrackCommit(tx DBTX) (end func(commitErr error)) {
	t, err := txOf(tx, "TrackCommit")
	if err != nil {
		return func(error) {}
	}
	return TrackCommitOn(sqlTx{sqlConn{t}})
}

// TrackCommitOn is [TrackCommit] of tx, the caller's transaction through
// any driver's adapter (idempgx.Tx of a pgx.Tx), as [Store.DoOn] takes it.
func TrackCommitOn(tx Tx) (end func(commitErr error)) {
	t := track(tx)
	return func(err error) { t.end(context.Background(), err == nil) }
}

// cacheCompleted adds the record of req, completed through c with out
// (resp as stored), to the cache once c's transaction commits, when it is
// tracked; its expiry is its retention from a statement sent after sent.
func (s *Store) cacheCompleted(c conn, req Request, out storedResponse, sent time.Time) {
	if c.commit == nil {
		return
	}
	e := &cacheEntry{id: cacheID(req), operation: req.Operation, fingerprint: req.Fingerprint,
		deadline: sent.Add(life(s.retentionOf(req)))}
	keyID, sealed := out.keyID.(string)
	if sealed && !s.cache.cfg.KeepOpened {
		e.resp.StatusCode = out.resp.StatusCode
		e.sealed = &keyRecord{code: sql.NullInt64{Int64: int64(out.resp.StatusCode), Valid: true}, body: out.body,
			sealedKey: sql.NullString{String: keyID, Valid: true}}
		e.sealed.ref, _ = out.ref.([]byte)
	} else {
		e.resp = cloneResponse(out.resp)
	}
	c.commit.add(s, e)
}

// cacheRead adds rec, read completed through c by readCompleted with the
// response resp (opened), to the cache once c's transaction commits,
// when it is tracked.
func (s *Store) cacheRead(c conn, req Request, rec keyRecord, resp Response) {
	if c.commit == nil || rec.until.IsZero() {
		return
	}
	e := &cacheEntry{id: cacheID(req), operation: rec.operation, fingerprint: rec.fingerprint, deadline: rec.until}
	if rec.sealedKey.String != "" && !s.cache.cfg.KeepOpened {
		e.resp.StatusCode = resp.StatusCode
		sealed := rec
		e.sealed = &sealed
	} else {
		e.resp = cloneResponse(resp)
	}
	c.commit.add(s, e)
}

// InTx runs fn in a transaction that r begins at isolation level iso (see
// [Runner]) and commits it, retrying it as [RunTx] does: up to 10
// attempts in all, with a jittered backoff, while the begin, fn or the
// commit fails with an error for which [IsRetryable] is true. fn must not
// commit or roll back tx. Unless the commit succeeds, tx is rolled back,
// on a context that ctx's end does not cancel so that the rollback is
// sent, also when fn panics (the panic goes on).
func InTx(ctx context.Context, r Runner, iso sql.IsolationLevel, fn func(tx Tx) error) error {
	return Retry(ctx, func() error {
		tx, err := r.BeginTx(ctx, iso)
		if err != nil {
			return err
		}
		return attempt(ctx, tx, fn)
	})
}

// InPipelinedTx is [InTx] (the retries, the rollback, the commit) in a
// transaction that r begins with BeginPipeline when it is a [Pipeliner]
// that can, and with BeginTx otherwise. fn gets the [Pipeline], which
// [Store.DoOn] finds in it: DoOn then sends BEGIN with its claim, and its
// completion with the COMMIT, which therefore comes after DoOn returns:
// the completion's failure is the commit's (an error that wraps it, for
// which [IsRetryable] is true when the claim was gone), and the
// transaction is rolled back.
func InPipelinedTx(ctx context.Context, r Runner, iso sql.IsolationLevel, fn func(tx Tx) error) error {
	p, ok := r.(Pipeliner)
	if !ok {
		return InTx(ctx, r, iso, fn)
	}
	return Retry(ctx, func() error {
		var tx Tx
		if pt := p.BeginPipeline(iso); pt != nil {
			tx = pt
		} else {
			t, err := r.BeginTx(ctx, iso)
			if err != nil {
				return err
			}
			tx = t
		}
		return attempt(ctx, tx, fn)
	})
}

// ender ends a transaction: a Tx, a pgx.Tx.
type ender interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// attempt runs fn in tx, a transaction its caller began, and commits it.
// Unless the commit succeeds, tx is rolled back (on a context that ctx's
// end does not cancel, so that the rollback is sent): when fn or the
// commit fails, and when fn panics or its goroutine exits (a test's
// t.Fatal), whose panic goes on.
func attempt[T ender](ctx context.Context, tx T, fn func(tx T) error) error {
	var t *tracked // for the replay caches, once a Store has one
	if cachesOn.Load() {
		t = track(tx)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			t.end(ctx, false)
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committed = true
	t.end(ctx, true)
	return nil
}

// runSQLTx is one attempt of [RunTx]: fn in a transaction begun on db,
// committed.
func runSQLTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	return attempt(ctx, sqlTx{sqlConn{tx}}, func(sqlTx) error { return fn(tx) })
}
