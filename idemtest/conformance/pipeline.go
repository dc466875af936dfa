package conformance

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// The pipelined transactions of a Runner that is an idem.Pipeliner
// (idempgx's), which idemhttp, idemgrpc and the consumer middleware run
// their handlers in, and idem.InPipelinedTx (idempgx.RunTx) its function:
// BEGIN goes in one round trip with Do's claim, and under READ COMMITTED
// the read of an existing record with them; the completion goes with
// COMMIT. The tests here hold what a Do does in one to what it does
// without pipelining, on every PostgreSQL target, direct and behind
// PgBouncer (whose pgx targets run in exec mode): where the target's
// Runner pipelines, through a pipelined transaction of its own
// (pipelinedTx), runTx and idemhttp on the Runner; on a database/sql one,
// which does not pipeline, through the same calls.

// pipeliner is the target's Runner with opts where it is an
// idem.Pipeliner, and nil elsewhere (database/sql does not pipeline). It
// fails the test where a Pipeliner begins no pipelined transaction on the
// target's pool: its Do would not take the pipelined path, which the
// tests would then not test.
func (e *env) pipeliner(opts *sql.TxOptions) idem.Pipeliner {
	e.t.Helper()
	p, ok := e.db.(*runnerPool)
	if !ok {
		return nil
	}
	r, ok := p.runner(opts).(idem.Pipeliner)
	if !ok {
		return nil
	}
	pt := r.BeginPipeline(sql.LevelDefault)
	if pt == nil {
		e.t.Fatalf("%s's Runner is an idem.Pipeliner that begins no pipelined transaction on its pool", e.Name)
	}
	must(e.t, pt.Rollback(ctx))
	return r
}

// mustPipeline fails the test where the target's Runner is an
// idem.Pipeliner whose Do would not take the pipelined path (pipeliner).
func (e *env) mustPipeline() {
	e.t.Helper()
	e.pipeliner(nil)
}

// needPipelines skips a test of the pipelined path itself where the
// target's Runner does not pipeline, saying so.
func (e *env) needPipelines() {
	e.t.Helper()
	if e.pipeliner(nil) == nil {
		e.t.Skipf("%s's Runner sends no pipelined transaction (idem.Pipeliner): this test counts a pipeline's round trips", e.Name)
	}
}

// pipelinedTx begins a transaction with opts as idemhttp and RunTx begin
// theirs: where the target's Runner pipelines, a pipelined one, which has
// sent nothing yet; elsewhere the pool's (a *sql.Tx on database/sql). The
// caller ends it.
func (e *env) pipelinedTx(opts *sql.TxOptions) (txn, error) {
	if r := e.pipeliner(opts); r != nil {
		return runnerTxn(r.BeginPipeline(sql.LevelDefault)), nil
	}
	return e.db.BeginTx(ctx, opts)
}

// pipelinedDo runs Do for req with fn in a pipelinedTx, and commits it,
// or rolls it back when Do fails: its error is Do's, or else the
// commit's, which on a pipelined transaction is the completion's too.
func (e *env) pipelinedDo(ctx context.Context, s *store, opts *sql.TxOptions, req idem.Request, fn func(tx handle) func(context.Context) (idem.Response, error)) (idem.Result, error) {
	tx, err := e.pipelinedTx(opts)
	if err != nil {
		return idem.Result{}, err
	}
	res, err := s.Do(ctx, tx, req, fn(tx))
	if err != nil {
		_ = tx.Rollback()
		return res, err
	}
	return res, tx.Commit()
}

// runTxDo runs Do for req with fn through runTx (idem.InPipelinedTx on a
// Runner's pool), which retries.
func (e *env) runTxDo(ctx context.Context, s *store, opts *sql.TxOptions, req idem.Request, fn func(tx handle) func(context.Context) (idem.Response, error)) (idem.Result, error) {
	var res idem.Result
	err := runTx(ctx, e.db, opts, func(tx txn) error {
		var err error
		res, err = s.Do(ctx, tx, req, fn(tx))
		return err
	})
	return res, err
}

// doWay is one way of running a Do in a transaction of idem's: once, or
// retried (RunTx).
type doWay struct {
	name    string
	retries bool
	do      func(e *env, ctx context.Context, s *store, opts *sql.TxOptions, req idem.Request, fn func(tx handle) func(context.Context) (idem.Response, error)) (idem.Result, error)
}

// key is a key of its own for the way, made from prefix.
func (w doWay) key(prefix string) string { return prefix + "-" + strings.ReplaceAll(w.name, " ", "-") }

var (
	doWays = []doWay{{"pipelined transaction", false, (*env).pipelinedDo}, {"RunTx", true, (*env).runTxDo}}
)

// doResult is what a Do run in another goroutine returned.
type doResult struct {
	res idem.Result
	err error
}

// holdKey makes req's claim in a transaction it leaves open, which the
// test ends: the holder a duplicate's claim waits for.
func (e *env) holdKey(s *store, o *op, req idem.Request) txn {
	e.t.Helper()
	holder := e.begin(nil)
	_, err := s.Do(ctx, holder, req, o.fn(holder, req.Key))
	must(e.t, err)
	return holder
}

// twoInstances serves h behind idemhttp in two instances on the table of
// a new Store (two Stores, as two processes have), here with the
// default Config and there with cfg, and returns the URL of each and the
// Store's table: a duplicate that reaches the other instance than the
// request holding its key waits on the row lock, in its claim, not in
// memory.
func (e *env) twoInstances(cfg idemhttp.Config, h http.Handler) (here, there, table string) {
	e.t.Helper()
	s := e.store()
	a, _ := e.serve(idemhttp.Config{Store: s.Store}, h)
	cfg.Store = e.elsewhere(s).Store
	b, _ := e.serve(cfg, h)
	return a.URL + "/v1/charges", b.URL + "/v1/charges", s.Table()
}

// gatedHandler is a handler behind idemhttp that writes a business row
// for its key through its transaction and then waits for the status to
// answer on answers (a 500 rolls back), or for its context to end (a
// 500). started gets a word once the row is written.
type gatedHandler struct {
	e       *env
	biz     string
	runs    atomic.Int64
	started chan struct{}
	answers chan int
}

func (e *env) gatedHandler() *gatedHandler {
	return &gatedHandler{e: e, biz: e.business(), started: make(chan struct{}, 4), answers: make(chan int, 4)}
}

func (g *gatedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := g.runs.Add(1)
	req, _ := idemhttp.RequestFrom(r.Context())
	if err := g.e.insertRow(g.e.txFrom(r.Context()), g.biz, req.Key, fmt.Sprintf("run-%d", run)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	g.started <- struct{}{}
	status := http.StatusInternalServerError
	select {
	case status = <-g.answers:
	case <-r.Context().Done():
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "run-%d", run)
}

// waitStarted waits for g's handler to have written its row.
func (g *gatedHandler) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-g.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30s")
	}
}

// A duplicate whose claim waits for the transaction that holds its key
// learns what that one did: under READ COMMITTED the read pipelined after
// its claim, a statement of its own, sees the holder's commit, and it
// replays; when the holder rolls back, its claim goes through and it
// runs. The same through a pipelined transaction, RunTx, and idemhttp
// (the holder a request on one instance, the duplicate on another).
func testPipelinedClaimWaits(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		s, o := e.store(), e.op()
		for _, way := range doWays {
			for _, commits := range []bool{true, false} {
				req := charge(way.key(fmt.Sprint("waits-", commits)), "100")
				holder := e.holdKey(s, o, req)
				done := make(chan doResult, 1)
				go func() {
					res, err := way.do(e, ctx, s, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
					done <- doResult{res, err}
				}()
				waitBlocked(e, s.Table(), done)
				if commits {
					must(t, holder.Commit())
				} else {
					must(t, holder.Rollback())
				}
				r := <-done
				must(t, r.err)
				if r.res.Replayed != commits {
					t.Fatalf("%s, the holder committing %v: replayed=%v, want %v", way.name, commits, r.res.Replayed, commits)
				}
				if n := e.count(o.biz, req.Key); n != 1 {
					t.Fatalf("%s, the holder committing %v: %d business rows, want 1", way.name, commits, n)
				}
			}
		}
		if n := o.calls.Load(); n != 6 { // each holder, and the duplicates whose holder rolled back
			t.Fatalf("fn ran %d times, want 6", n)
		}

		g := e.gatedHandler()
		here, there, table := e.twoInstances(idemhttp.Config{}, g)
		client := &http.Client{}
		for _, commits := range []bool{true, false} {
			key := fmt.Sprintf("waits-http-%v", commits)
			first := make(chan response, 1)
			go func() { r, _ := post(client, here, `{"amount": 1}`, key); first <- r }()
			g.waitStarted(t)
			dup := make(chan response, 1)
			go func() { r, _ := post(client, there, `{"amount": 1}`, key); dup <- r }()
			waitBlocked(e, table, dup) // on another instance: it waits in its claim
			status := http.StatusCreated
			if !commits {
				status = http.StatusInternalServerError
			}
			g.answers <- status
			if r := <-first; r.status != status {
				t.Fatalf("the holding request: %d %s, want %d", r.status, r.body, status)
			}
			if !commits {
				g.waitStarted(t) // the duplicate runs the handler itself
				g.answers <- http.StatusCreated
			}
			r := <-dup
			if r.status != http.StatusCreated || r.replayed() != commits {
				t.Fatalf("the duplicate, the holder committing %v: %d replayed=%v %s", commits, r.status, r.replayed(), r.body)
			}
			if n := e.count(g.biz, key); n != 1 {
				t.Fatalf("the holder committing %v: %d business rows, want 1", commits, n)
			}
		}
	})
}

// A claim that fails fails Do as it does without pipelining, and the read
// pipelined after it does not run: a lock timeout (WithLockTimeout's
// bound is an *InFlightError, and the transaction stays usable: it
// commits what else it wrote; the session's own lock_timeout is a
// retryable error, which RunTx retries until the holder's result
// replays), and a serialization failure (under REPEATABLE READ and
// SERIALIZABLE, a holder that commits while the claim waits: retryable,
// and RunTx replays its result).
func testPipelinedClaimFails(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		const bound = 300 * time.Millisecond
		s, o := e.store(idem.WithLockTimeout(bound)), e.op()
		req := charge("bounded", "100")
		holder := e.holdKey(s, o, req)
		tx, err := e.pipelinedTx(nil)
		must(t, err)
		_, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
		wantInFlight(t, err, time.Second, time.Second)
		must(t, e.insertRow(tx, o.biz, "own-row", "after"))
		must(t, tx.Commit())
		must(t, holder.Commit())
		if n, own := e.count(o.biz, req.Key), e.count(o.biz, "own-row"); n != 1 || own != 1 {
			t.Fatalf("%d business rows of the key and %d of the caller's own, want 1 and 1", n, own)
		}

		s = e.store()
		for _, way := range doWays {
			req := charge(way.key("session-lock-timeout"), "100")
			holder := e.holdKey(s, o, req)
			committed := make(chan error, 1)
			time.AfterFunc(time.Second, func() { committed <- holder.Commit() })
			var attempts atomic.Int64
			res, err := way.do(e, ctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) {
				attempts.Add(1)
				if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil { // before the claim
					t.Errorf("SET LOCAL lock_timeout: %v", err)
				}
				return o.fn(tx, req.Key)
			})
			switch {
			case !way.retries && (!idem.IsRetryable(err) || sqlState(err) != "55P03"):
				t.Fatalf("%s: the claim past lock_timeout: %v, want its retryable 55P03", way.name, err)
			case way.retries && (err != nil || !res.Replayed || attempts.Load() < 2):
				t.Fatalf("%s: %+v, %v after %d attempts; want the holder's result replayed, after a retry", way.name, res, err, attempts.Load())
			}
			must(t, <-committed)
		}

		for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			for _, way := range doWays {
				req := charge(way.key("serialization-"+levelName(level)), "100")
				holder := e.holdKey(s, o, req)
				calls := o.calls.Load()
				done := make(chan doResult, 1)
				go func() {
					res, err := way.do(e, ctx, s, &sql.TxOptions{Isolation: level}, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
					done <- doResult{res, err}
				}()
				waitBlocked(e, s.Table(), done)
				must(t, holder.Commit())
				r := <-done
				switch {
				case !way.retries && (!idem.IsRetryable(r.err) || sqlState(r.err) != "40001"):
					t.Fatalf("%s %s: a duplicate whose holder committed after its snapshot: %+v, %v; want the claim's serialization failure", levelName(level), way.name, r.res, r.err)
				case way.retries && (r.err != nil || !r.res.Replayed):
					t.Fatalf("%s %s: %+v, %v; want the holder's result replayed", levelName(level), way.name, r.res, r.err)
				}
				if n := e.count(o.biz, req.Key); n != 1 || o.calls.Load() != calls {
					t.Fatalf("%s %s: %d business rows, fn ran %d times more; want 1 and 0", levelName(level), way.name, n, o.calls.Load()-calls)
				}
			}
		}
	})
}

// Under REPEATABLE READ and SERIALIZABLE the read pipelined after the
// claim reads nothing, and cannot see a commit newer than the
// transaction's snapshot; the claim's own error decides, as without
// pipelining: a key completed after the snapshot was taken is a
// serialization failure (never a second run), one completed before it
// replays (the record read on its own, as the snapshot shows it), and a
// fresh key runs and commits.
func testPipelinedSnapshot(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		s, o := e.store(), e.op()
		other := e.elsewhere(s)
		for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			opts := &sql.TxOptions{Isolation: level}
			before, after := charge("before-"+levelName(level), "100"), charge("after-"+levelName(level), "100")
			_, err := o.do(s, before)
			must(t, err)
			tx, err := e.pipelinedTx(opts)
			must(t, err)
			var n int
			must(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+o.biz).Scan(&n)) // takes the snapshot
			_, err = o.do(s, after)
			must(t, err)
			calls := o.calls.Load()
			res, err := other.Do(ctx, tx, after, o.fn(tx, after.Key))
			if !idem.IsRetryable(err) || sqlState(err) != "40001" {
				t.Fatalf("%s: a key completed after the snapshot: %+v, %v; want the claim's serialization failure", levelName(level), res, err)
			}
			must(t, tx.Rollback())

			tx, err = e.pipelinedTx(opts)
			must(t, err)
			must(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+o.biz).Scan(&n))
			res, err = other.Do(ctx, tx, before, o.fn(tx, before.Key))
			must(t, err)
			must(t, tx.Commit())
			if !res.Replayed {
				t.Fatalf("%s: a key completed before the snapshot: %+v, want a replay", levelName(level), res)
			}
			fresh := charge("fresh-"+levelName(level), "100")
			res, err = e.pipelinedDo(ctx, s, opts, fresh, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, fresh.Key) })
			must(t, err)
			if res.Replayed || e.count(o.biz, fresh.Key) != 1 || e.records(s, fresh.Key) != 1 {
				t.Fatalf("%s: a fresh key: %+v, %d business rows, %d records; want it run and committed", levelName(level), res, e.count(o.biz, fresh.Key), e.records(s, fresh.Key))
			}
			if o.calls.Load() != calls+1 {
				t.Fatalf("%s: fn ran %d times for the replays and the fresh key, want once", levelName(level), o.calls.Load()-calls)
			}
			for _, k := range []string{before.Key, after.Key} {
				if n := e.count(o.biz, k); n != 1 {
					t.Fatalf("%s: %d business rows for %s, want 1", levelName(level), n, k)
				}
			}
		}
	})
}

// A COMMIT that fails (a deferred constraint the handler's rows break) is
// a failed call, never a success, also where the completion went in one
// round trip with it: nothing is stored, and a retry runs again. A
// completion that finds its claim gone (the handler deleted it) keeps
// the COMMIT from running: a retryable error, nothing committed, and
// RunTx's retry runs once more.
func testPipelinedCommitFails(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		s := e.store()
		biz := randName("deferred")
		e.exec("CREATE TABLE " + biz + " (k VARCHAR(255) NOT NULL, v VARCHAR(255) NOT NULL, UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)")
		e.dropLater(biz)
		var runs atomic.Int64
		twice := func(tx handle, key string) func(context.Context) (idem.Response, error) {
			return func(context.Context) (idem.Response, error) {
				runs.Add(1)
				for _, v := range []string{"a", "b"} { // the second breaks the constraint, at COMMIT
					if err := e.insertRow(tx, biz, key, v); err != nil {
						return idem.Response{}, err
					}
				}
				return idem.Response{StatusCode: 201}, nil
			}
		}
		for _, way := range doWays {
			req := charge(way.key("commit-fails"), "100")
			res, err := way.do(e, ctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) { return twice(tx, req.Key) })
			if sqlState(err) != "23505" {
				t.Fatalf("%s: a COMMIT that broke a deferred constraint: %+v, %v; want its 23505", way.name, res, err)
			}
			if n, r := e.int64("SELECT COUNT(*) FROM "+biz+" WHERE k = ?", req.Key), e.records(s, req.Key); n != 0 || r != 0 {
				t.Fatalf("%s: %d business rows and %d records after the COMMIT failed, want none", way.name, n, r)
			}
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("the operation ran %d times, want once a way", n)
		}

		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := idemhttp.RequestFrom(r.Context())
			if _, err := twice(e.txFrom(r.Context()), req.Key)(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		srv, _ := e.serve(idemhttp.Config{Store: s.Store}, h)
		for range 2 {
			r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 1}`, "commit-fails-http")
			must(t, err)
			if r.status != http.StatusInternalServerError || r.replayed() {
				t.Fatalf("a request whose COMMIT failed: %d replayed=%v %s, want a 500, never stored", r.status, r.replayed(), r.body)
			}
		}
		if n, r := e.int64("SELECT COUNT(*) FROM "+biz+" WHERE k = 'commit-fails-http'"), e.records(s, "commit-fails-http"); n != 0 || r != 0 || runs.Load() != 4 {
			t.Fatalf("%d business rows, %d records and %d runs after two failed COMMITs, want 0, 0 and 4", n, r, runs.Load())
		}

		o := e.op()
		for _, way := range doWays {
			req := charge(way.key("claim-gone"), "100")
			first := o.calls.Load() + 1
			res, err := way.do(e, ctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) {
				return func(ctx context.Context) (idem.Response, error) {
					if o.calls.Load()+1 == first { // the first run deletes its own claim
						if _, err := tx.ExecContext(ctx, e.rebind("DELETE FROM "+s.Table()+" WHERE idem_key = ?"), req.Key); err != nil {
							return idem.Response{}, err
						}
					}
					return o.fn(tx, req.Key)(ctx)
				}
			})
			switch {
			case !way.retries && !idem.IsRetryable(err):
				t.Fatalf("%s: a completion whose claim is gone: %+v, %v; want a retryable error", way.name, res, err)
			case !way.retries && (e.count(o.biz, req.Key) != 0 || e.records(s, req.Key) != 0):
				t.Fatalf("%s: %d business rows, %d records committed without the claim, want none", way.name, e.count(o.biz, req.Key), e.records(s, req.Key))
			case way.retries && (err != nil || res.Replayed || e.count(o.biz, req.Key) != 1 || e.records(s, req.Key) != 1):
				t.Fatalf("%s: %+v, %v, %d business rows, %d records; want the retry run and committed alone", way.name, res, err, e.count(o.biz, req.Key), e.records(s, req.Key))
			}
		}
	})
}

// A Do whose context ends while its claim waits in the pipelined batch
// fails, and leaves nothing behind: no business row, no claim. Once the
// holder rolls back, the key is free at once, and a request runs; through
// idemhttp, a duplicate waiting past Config.Timeout in its claim on
// another instance answers an error, and a retry replays the holder's
// result once it committed.
func testPipelinedCancel(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		s, o := e.store(), e.op()
		for _, way := range doWays {
			req := charge(way.key("cancel"), "100")
			holder := e.holdKey(s, o, req)
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan doResult, 1)
			go func() {
				res, err := way.do(e, cctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
				done <- doResult{res, err}
			}()
			waitBlocked(e, s.Table(), done)
			cancel()
			select {
			case r := <-done:
				if r.err == nil {
					t.Fatalf("%s: a Do cancelled in its claim: %+v, no error", way.name, r.res)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: a Do cancelled in its claim had not returned after 10s", way.name)
			}
			calls := o.calls.Load()
			must(t, holder.Rollback())
			within, stop := context.WithTimeout(ctx, 10*time.Second)
			res, err := e.runTxDo(within, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
			stop()
			must(t, err)
			if res.Replayed || o.calls.Load() != calls+1 || e.count(o.biz, req.Key) != 1 {
				t.Fatalf("%s: after the holder rolled back: %+v, fn ran %d times, %d business rows; want one fresh run", way.name, res, o.calls.Load()-calls, e.count(o.biz, req.Key))
			}
		}

		g := e.gatedHandler()
		here, there, _ := e.twoInstances(idemhttp.Config{Timeout: 500 * time.Millisecond}, g)
		client := &http.Client{}
		first := make(chan response, 1)
		go func() { r, _ := post(client, here, `{"amount": 1}`, "cancel-http"); first <- r }()
		g.waitStarted(t)
		dup, err := post(client, there, `{"amount": 1}`, "cancel-http")
		must(t, err)
		if dup.status < 500 {
			t.Fatalf("a duplicate waiting in its claim past its Timeout: %d %s, want an error", dup.status, dup.body)
		}
		g.answers <- http.StatusCreated
		if r := <-first; r.status != http.StatusCreated {
			t.Fatalf("the holding request: %d %s", r.status, r.body)
		}
		r, err := post(client, there, `{"amount": 1}`, "cancel-http")
		must(t, err)
		if r.status != http.StatusCreated || !r.replayed() || e.count(g.biz, "cancel-http") != 1 {
			t.Fatalf("a retry: %d replayed=%v %s, %d business rows; want the holder's result replayed", r.status, r.replayed(), r.body, e.count(g.biz, "cancel-http"))
		}
	})
}

// An error of the handler rolls its transaction back, pipelined as not:
// Do returns it, nothing of it is stored, and the next request runs; a
// 5xx through idemhttp likewise.
func testPipelinedHandlerError(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.mustPipeline()
		s, o := e.store(), e.op()
		for _, way := range doWays {
			req := charge(way.key("handler-error"), "100")
			_, err := way.do(e, ctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) {
				return func(ctx context.Context) (idem.Response, error) {
					if _, err := o.fn(tx, req.Key)(ctx); err != nil {
						return idem.Response{}, err
					}
					return idem.Response{}, errDeclined
				}
			})
			if !errors.Is(err, errDeclined) {
				t.Fatalf("%s: %v, want the handler's error", way.name, err)
			}
			if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 0 || r != 0 {
				t.Fatalf("%s: %d business rows and %d records after the handler failed, want none", way.name, n, r)
			}
			res, err := way.do(e, ctx, s, nil, req, func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) })
			must(t, err)
			if res.Replayed || e.count(o.biz, req.Key) != 1 {
				t.Fatalf("%s: the next request: %+v, %d business rows; want it run", way.name, res, e.count(o.biz, req.Key))
			}
		}

		g := e.gatedHandler()
		srv, st := e.serve(idemhttp.Config{}, g)
		for _, status := range []int{http.StatusInternalServerError, http.StatusCreated} {
			g.answers <- status
			r, err := post(srv.Client(), srv.URL+"/v1/charges", `{"amount": 1}`, "handler-error-http")
			must(t, err)
			g.waitStarted(t)
			if r.status != status || r.replayed() {
				t.Fatalf("%d replayed=%v %s, want %d run", r.status, r.replayed(), r.body, status)
			}
		}
		if n, rec := e.count(g.biz, "handler-error-http"), e.records(st, "handler-error-http"); n != 1 || rec != 1 {
			t.Fatalf("%d business rows, %d records; want only the second request's", n, rec)
		}
	})
}

// The round trips of a Do in a pipelined transaction, on a PostgreSQL
// target whose Runner pipelines (pgx's, direct and behind PgBouncer in
// exec mode), counted by a proxy between the driver and the server: BEGIN with the claim, and with the read of an
// existing record under READ COMMITTED, in one; the handler's statement;
// the completion with COMMIT in one. A transaction of pgx's own spends a
// round trip on each.
func testPipelinedRoundTrips(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.needPipelines()
		s, o := e.store(), e.op()
		other := e.elsewhere(s)
		bounded := e.store(idem.WithLockTimeout(time.Second))
		p := e.startTripProxy()
		pe := e.proxied(p)
		rr := &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
		fn := func(req idem.Request) func(tx handle) func(context.Context) (idem.Response, error) {
			return func(tx handle) func(context.Context) (idem.Response, error) { return o.fn(tx, req.Key) }
		}
		failing := func(tx handle) func(context.Context) (idem.Response, error) {
			return func(ctx context.Context) (idem.Response, error) {
				if err := e.insertRow(tx, o.biz, "failing", "x"); err != nil {
					return idem.Response{}, err
				}
				return idem.Response{}, errDeclined
			}
		}
		for _, c := range []struct {
			path string
			want int64
			run  func(i int) error
		}{
			{"fresh", 3, func(i int) error {
				_, err := pe.pipelinedDo(ctx, s, nil, charge(fmt.Sprint("rt-fresh-", i), "1"), fn(charge(fmt.Sprint("rt-fresh-", i), "1")))
				return err
			}},
			{"fresh through RunTx", 3, func(i int) error {
				_, err := pe.runTxDo(ctx, s, nil, charge(fmt.Sprint("rt-runtx-", i), "1"), fn(charge(fmt.Sprint("rt-runtx-", i), "1")))
				return err
			}},
			{"replay of a key the Store served", 2, func(int) error {
				_, err := pe.pipelinedDo(ctx, s, nil, charge("rt-fresh-0", "1"), fn(charge("rt-fresh-0", "1")))
				return err
			}},
			{"replay from another instance", 2, func(i int) error {
				_, err := pe.pipelinedDo(ctx, e.elsewhere(s), nil, charge("rt-fresh-0", "1"), fn(charge("rt-fresh-0", "1")))
				return err
			}},
			{"replay from another instance through RunTx", 2, func(i int) error {
				_, err := pe.runTxDo(ctx, e.elsewhere(s), nil, charge("rt-fresh-0", "1"), fn(charge("rt-fresh-0", "1")))
				return err
			}},
			// The read after the claim is a statement of its own: it sees
			// what the holder committed while the claim waited.
			{"a duplicate that waited for the holder's commit", 2, func(i int) error {
				req := charge(fmt.Sprint("rt-waited-", i), "1")
				holder := e.holdKey(s, o, req)
				done := make(chan doResult, 1)
				go func() {
					res, err := pe.pipelinedDo(ctx, other, nil, req, fn(req))
					done <- doResult{res, err}
				}()
				waitBlocked(e, s.Table(), done)
				must(t, holder.Commit())
				r := <-done
				if r.err == nil && !r.res.Replayed {
					r.err = errors.New("it ran; want the holder's result replayed")
				}
				return r.err
			}},
			{"mismatch", 2, func(int) error {
				_, err := pe.pipelinedDo(ctx, other, nil, charge("rt-fresh-0", "2"), fn(charge("rt-fresh-0", "2")))
				return want(err, idem.ErrMismatch)
			}},
			{"in flight", 2, func(i int) error {
				req := charge(fmt.Sprint("rt-held-", i), "1")
				e.leaveClaim(s, req, time.Minute)
				_, err := pe.pipelinedDo(ctx, other, nil, req, fn(req))
				return want(err, idem.ErrInFlight)
			}},
			{"takeover", 4, func(i int) error {
				req := charge(fmt.Sprint("rt-expired-", i), "1")
				e.leaveClaim(s, req, -time.Second)
				_, err := pe.pipelinedDo(ctx, other, nil, req, fn(req))
				return err
			}},
			{"the handler failed", 4, func(i int) error {
				_, err := pe.pipelinedDo(ctx, s, nil, charge(fmt.Sprint("rt-failing-", i), "1"), failing)
				return want(err, errDeclined)
			}},
			{"fresh under REPEATABLE READ", 3, func(i int) error {
				_, err := pe.pipelinedDo(ctx, s, rr, charge(fmt.Sprint("rt-rr-", i), "1"), fn(charge(fmt.Sprint("rt-rr-", i), "1")))
				return err
			}},
			// There the read after the claim reads nothing: the record
			// is read on its own.
			{"replay from another instance under REPEATABLE READ", 3, func(int) error {
				_, err := pe.pipelinedDo(ctx, e.elsewhere(s), rr, charge("rt-fresh-0", "1"), fn(charge("rt-fresh-0", "1")))
				return err
			}},
			{"replay from another instance under SERIALIZABLE", 3, func(int) error {
				_, err := pe.pipelinedDo(ctx, e.elsewhere(s), &sql.TxOptions{Isolation: sql.LevelSerializable}, charge("rt-fresh-0", "1"), fn(charge("rt-fresh-0", "1")))
				return err
			}},
			// The bound's statements are a round trip each, but the
			// SAVEPOINT, which goes with BEGIN, and the claim is one of
			// its own.
			{"fresh with WithLockTimeout", 3 + e.LockTimeoutStatements, func(i int) error {
				_, err := pe.pipelinedDo(ctx, bounded, nil, charge(fmt.Sprint("rt-bounded-", i), "1"), fn(charge(fmt.Sprint("rt-bounded-", i), "1")))
				return err
			}},
		} {
			for i := range 2 { // the first fills pgx's statement cache
				start := p.trips.Load()
				if err := c.run(i); err != nil {
					t.Fatalf("%s: %v", c.path, err)
				}
				if n := p.trips.Load() - start; i == 1 && n != c.want {
					t.Errorf("%s: %d round trips, want %d", c.path, n, c.want)
				}
			}
		}
	})
}

// proxied is e on a pool of one connection through p, which counts its
// round trips, and which sends nothing that is not counted (Silent: no
// ping when a connection is taken).
func (e *env) proxied(p *tripProxy) *env {
	e.t.Helper()
	db, err := e.dial(e.proxiedDSN(p.ln.Addr().String()), Options{Conns: 1, Silent: true})
	must(e.t, err)
	e.t.Cleanup(db.close)
	pe := e.in(e.t)
	pe.db = db
	return pe
}

// want is nil when err is target, and otherwise an error that says so.
func want(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return fmt.Errorf("%v, want %v", err, target)
}

// sqlState is the SQLSTATE of the PostgreSQL error in err's tree, or "".
func sqlState(err error) string {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}

// tripProxy forwards connections to the target's server and counts the
// round trips PostgreSQL clients wait on: their Sync and Query messages.
type tripProxy struct {
	ln    net.Listener
	trips atomic.Int64
}

// startTripProxy starts a tripProxy in front of the target's server,
// stopped when the test ends.
func (e *env) startTripProxy() *tripProxy {
	e.t.Helper()
	network, addr := e.serverAddr()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(e.t, err)
	p := &tripProxy{ln: ln}
	var wg sync.WaitGroup
	e.t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial(network, addr)
			if err != nil {
				_ = client.Close()
				continue
			}
			wg.Go(func() { _, _ = io.Copy(client, server); _ = client.Close() })
			wg.Go(func() { p.forward(server, client); _ = server.Close() })
		}
	})
	return p
}

// forward copies a client's stream to the server, counting its Sync and
// Query messages: the messages after the StartupMessage are a type byte
// and a length that counts itself.
func (p *tripProxy) forward(dst io.Writer, src io.Reader) {
	var pending []byte
	startup := true
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			pending = append(pending, buf[:n]...)
			for {
				if startup {
					if len(pending) < 8 || len(pending) < int(binary.BigEndian.Uint32(pending)) {
						break
					}
					// SSLRequest, GSSENCRequest and CancelRequest come
					// before or instead of the StartupMessage.
					switch binary.BigEndian.Uint32(pending[4:]) {
					case 80877103, 80877104, 80877102:
					default:
						startup = false
					}
					pending = pending[binary.BigEndian.Uint32(pending):]
					continue
				}
				if len(pending) < 5 || len(pending) < 1+int(binary.BigEndian.Uint32(pending[1:])) {
					break
				}
				if pending[0] == 'S' || pending[0] == 'Q' {
					p.trips.Add(1)
				}
				pending = pending[1+binary.BigEndian.Uint32(pending[1:]):]
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
