package conformance

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Apply is Do for an operation whose response is known before it runs
// (a message consumer's): the claim of a new key stores the response
// with it, and nothing is written after fn. The tests here hold it to
// Do's outcomes on every target.

// applied is the response the tests' Apply calls store.
var applied = idem.Response{StatusCode: 200, Header: http.Header{"X-Consumed": {"yes"}}, Body: []byte("done")}

// apply runs s.Apply for req in a transaction of its own (retried, as
// RunTx does), with fn inserting o's business row, and commits it.
func (o *op) apply(s *store, req idem.Request) (idem.Result, error) {
	var res idem.Result
	err := runTx(ctx, o.e.db, nil, func(tx txn) error {
		var err error
		res, err = s.Apply(ctx, tx, req, applied, o.applyFn(tx, req.Key))
		return err
	})
	return res, err
}

// applyFn is o.fn for Apply: it writes the business row and answers
// nothing.
func (o *op) applyFn(tx handle, key string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := o.fn(tx, key)(ctx)
		return err
	}
}

// A fresh key runs fn once, in one statement of idem's beside fn's, and
// its record commits or rolls back with the business row; a retry, by
// Apply or by Do, replays the response Apply stored; another payload is
// ErrMismatch; an fn that fails stores nothing, even when its caller
// commits; a response that is not valid is refused before anything runs.
func testApply(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("apply-1", "100")

		tx := e.begin(nil)
		res, err := s.Apply(ctx, tx, req, applied, o.applyFn(tx, req.Key))
		must(t, err)
		if res.Replayed || res.StatusCode != 200 || string(res.Body) != "done" {
			t.Fatalf("first Apply: %+v", res)
		}
		must(t, tx.Rollback())
		if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 0 || r != 0 {
			t.Fatalf("after rollback: %d business rows, %d records; want 0, 0", n, r)
		}

		// The Store remembers the key it served, and reads it first
		// (TestCompletedKeyHint): another process's sees a fresh key.
		tx, sent := counted(e.begin(nil))
		_, err = e.elsewhere(s).Apply(ctx, tx, req, applied, o.applyFn(tx, req.Key))
		must(t, err)
		must(t, tx.Commit())
		if want := e.SettingsCheck + 1 + 1; sent.Load() != want { // the claim and fn's row
			t.Errorf("a fresh Apply ran %d statements, fn's one among them; want %d", sent.Load(), want)
		}
		if n, r := e.count(o.biz, req.Key), e.records(s, req.Key); n != 1 || r != 1 || o.calls.Load() != 2 {
			t.Fatalf("after commit: %d business rows, %d records, %d runs; want 1, 1, 2", n, r, o.calls.Load())
		}

		for name, st := range map[string]*store{"this process": s, "another process": e.elsewhere(s)} {
			res, err := o.apply(st, req)
			must(t, err)
			if !res.Replayed || res.StatusCode != 200 || !bytes.Equal(res.Body, applied.Body) || res.Header.Get("X-Consumed") != "yes" {
				t.Fatalf("Apply's replay in %s: %+v", name, res)
			}
			if res, err = o.do(st, req); err != nil || !res.Replayed || !bytes.Equal(res.Body, applied.Body) {
				t.Fatalf("Do's replay in %s: %+v, %v", name, res, err)
			}
			if _, err := o.apply(st, charge(req.Key, "999")); !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("another payload in %s: %v, want ErrMismatch", name, err)
			}
		}

		failed := charge("apply-failed", "100")
		tx = e.begin(nil)
		_, err = s.Apply(ctx, tx, failed, applied, func(context.Context) error { return errDeclined })
		if !errors.Is(err, errDeclined) {
			t.Fatalf("fn's error: %v, want it back", err)
		}
		must(t, tx.Commit()) // against the advice: the claim is gone all the same
		if r := e.records(s, failed.Key); r != 0 {
			t.Fatalf("an Apply whose fn failed left %d records, committed", r)
		}
		if res, err := o.apply(s, failed); err != nil || res.Replayed {
			t.Fatalf("the retry of a failed Apply: %+v, %v; want a run", res, err)
		}

		bad := charge("apply-bad", "100")
		tx, sent = counted(e.begin(nil))
		_, err = s.Apply(ctx, tx, bad, idem.Response{}, o.applyFn(tx, bad.Key))
		must(t, tx.Rollback())
		if err == nil || sent.Load() != 0 {
			t.Fatalf("a response without a status: %v after %d statements; want an error before any", err, sent.Load())
		}
		if n := o.calls.Load(); n != 3 {
			t.Fatalf("fn ran %d times, want 3", n)
		}
	})
}

// Apply takes over a claim left by a process that died (its lease over)
// and, as that record is a PROCESSING claim, stores its response after
// fn, fenced as Do's completion; a live claim is in flight; a sealing
// Store stores Apply's response sealed.
func testApplyTakesOver(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		left := charge("apply-left", "100")
		e.leaveClaim(s, left, -time.Second)
		res, err := o.apply(s, left)
		if err != nil || res.Replayed {
			t.Fatalf("Apply on a claim whose lease ended: %+v, %v; want a run", res, err)
		}
		if res, err := o.do(e.elsewhere(s), left); err != nil || !res.Replayed || !bytes.Equal(res.Body, applied.Body) {
			t.Fatalf("the replay of the record Apply took over: %+v, %v", res, err)
		}
		live := charge("apply-live", "100")
		e.leaveClaim(s, live, time.Minute)
		if _, err := o.apply(s, live); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("Apply on a live claim: %v, want ErrInFlight", err)
		}

		sealed := e.also(s, idem.WithSealer(sealerOf(t, "k1", "k1")))
		req := charge("apply-sealed", "100")
		_, err = o.apply(sealed, req)
		must(t, err)
		var body []byte
		var keyID string
		must(t, e.db.QueryRow(e.rebind("SELECT response_body, sealed_key FROM "+s.Table()+" WHERE idem_key = ?"), req.Key).Scan(&body, &keyID))
		if bytes.Contains(body, applied.Body) || keyID != "k1" {
			t.Fatalf("Apply's stored body %q, sealed with %q; want it sealed with k1", body, keyID)
		}
		if res, err := o.do(sealed, req); err != nil || !res.Replayed || !bytes.Equal(res.Body, applied.Body) {
			t.Fatalf("the sealed replay: %+v, %v", res, err)
		}
		if n, rows := o.calls.Load(), e.count(o.biz, left.Key)+e.count(o.biz, req.Key); n != 2 || rows != 2 {
			t.Fatalf("%d runs and %d business rows, want 2 of each", n, rows)
		}
	})
}

// A storm of duplicates, each Apply in its own transaction, runs fn once
// and replays its response everywhere else, under every isolation level.
func testApplyStorm(t *testing.T) {
	const workers = 32
	forEach(t, func(t *testing.T, e *env) {
		for _, level := range isolationLevels {
			t.Run(levelName(level), func(t *testing.T) {
				e := e.in(t)
				e.skipLevel(level)
				s, o := e.store(), e.op()
				req := charge("apply-storm", "100")
				var (
					wg                 sync.WaitGroup
					mu                 sync.Mutex
					executed, replayed int
					errs               []error
				)
				start := make(chan struct{})
				for range workers {
					wg.Go(func() {
						<-start
						var res idem.Result
						err := runTx(ctx, e.db, &sql.TxOptions{Isolation: level}, func(tx txn) error {
							var err error
							res, err = s.Apply(ctx, tx, req, applied, func(ctx context.Context) error {
								time.Sleep(50 * time.Millisecond)
								return o.applyFn(tx, req.Key)(ctx)
							})
							return err
						})
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case !bytes.Equal(res.Body, applied.Body):
							errs = append(errs, fmt.Errorf("result %d %q, want %q", res.StatusCode, res.Body, applied.Body))
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
				if n := e.count(o.biz, req.Key); n != 1 {
					t.Fatalf("%d business rows, want exactly 1", n)
				}
				if executed != 1 || replayed != workers-1 {
					t.Fatalf("executed %d, replayed %d; want 1 and %d", executed, replayed, workers-1)
				}
			})
		}
	})
}

// Through a pipelined transaction (idem.Pipeliner: pgx's), a fresh Apply's claim goes
// with BEGIN and its COMMIT alone: three round trips with fn's statement,
// as Do's, with one statement of idem's fewer; a failing fn leaves
// nothing.
func testPipelinedApply(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		e.needPipelines()
		s, o := e.store(), e.op()
		p := e.startTripProxy()
		pe := e.proxied(p)
		for i := range 2 { // the first fills pgx's statement cache
			req := charge(fmt.Sprint("apply-rt-", i), "1")
			tx, err := pe.pipelinedTx(nil)
			must(t, err)
			start := p.trips.Load()
			_, err = s.Apply(ctx, tx, req, applied, o.applyFn(tx, req.Key))
			must(t, err)
			must(t, tx.Commit())
			if n := p.trips.Load() - start; i == 1 && n != 3 {
				t.Errorf("a fresh Apply in a pipelined transaction: %d round trips, want 3", n)
			}
			// A completion would have stamped the record with its own
			// statement's time.
			if n := e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE idem_key = ? AND status = 'completed' AND completed_at = created_at", req.Key); n != 1 {
				t.Errorf("a fresh Apply's record was completed after its claim, or not at all (%d records completed with it)", n)
			}
		}
		failed := charge("apply-rt-failed", "1")
		tx, err := pe.pipelinedTx(nil)
		must(t, err)
		if _, err := s.Apply(ctx, tx, failed, applied, func(context.Context) error { return errDeclined }); !errors.Is(err, errDeclined) {
			t.Fatalf("fn's error: %v", err)
		}
		must(t, tx.Rollback())
		if n, r := o.calls.Load(), e.records(s, failed.Key); n != 2 || r != 0 {
			t.Fatalf("%d runs, %d records of the failed Apply; want 2, 0", n, r)
		}
	})
}
