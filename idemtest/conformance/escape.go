package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// lockRows makes a table of n rows (id 1..n), dropped when the test ends,
// for transactions to lock in an order that deadlocks.
func (e *env) lockRows(n int) string {
	e.t.Helper()
	table := randName("locks")
	e.exec("CREATE TABLE " + table + " (id INT PRIMARY KEY, n INT NOT NULL)")
	e.dropLater(table)
	for i := 1; i <= n; i++ {
		e.exec("INSERT INTO "+table+" (id, n) VALUES (?, 0)", i)
	}
	return table
}

// waitingOn reports whether a statement on table waits for a lock, as
// WaitingQuery counts them (on MySQL: is running, its lock views being a
// slow cache).
func (e *env) waitingOn(table string) (bool, error) {
	n, err := e.sumNodes(e.WaitingQuery, "%"+table+"%")
	return n > 0, err
}

// deadlock makes tx the victim of a deadlock: tx locks row 1, another
// transaction that has changed every other row (so that InnoDB, which rolls
// back the transaction that changed least, picks tx) locks row 2, tx waits
// for row 2, and the other one closes the cycle by asking for row 1.
// Where the victim must be the transaction that closes the cycle
// (CycleCloser: TiDB, and Postgres, where tx's shorter deadlock_timeout
// from DeadlockSetup makes it check first) tx asks last
// (deadlockAskingLast). It returns tx's error and, once the other
// transaction has committed, that one's.
func (e *env) deadlock(tx txn, locks string) (txErr, otherErr error) {
	if e.DeadlockSetup != "" {
		if _, err := tx.ExecContext(ctx, e.DeadlockSetup); err != nil {
			return err, nil
		}
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 1"); err != nil {
		return err, nil
	}
	other, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := other.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id >= 2"); err != nil {
		_ = other.Rollback()
		return nil, err
	}
	if e.CycleCloser != nil {
		return e.deadlockAskingLast(tx, other, locks)
	}
	otherDone, stop := make(chan error, 1), make(chan struct{})
	go func() {
		for {
			waiting, err := e.waitingOn(locks)
			if err != nil {
				_ = other.Rollback()
				otherDone <- err
				return
			}
			if waiting {
				break
			}
			select {
			case <-stop: // tx's statement returned without waiting
				otherDone <- other.Rollback()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		if _, err := other.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 1"); err != nil {
			_ = other.Rollback()
			otherDone <- fmt.Errorf("the other transaction: %w", err)
			return
		}
		otherDone <- other.Commit()
	}()
	_, txErr = tx.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 2")
	close(stop)
	return txErr, <-otherDone
}

// deadlockAskingLast is deadlock where the victim must close the cycle
// (CycleCloser): other asks for row 1 first and waits (CycleCloser's lock
// view shows it), then tx asks for row 2. The database rolls back tx
// (Postgres keeps it open and aborted, its locks released), so other
// gets row 1 and commits.
func (e *env) deadlockAskingLast(tx, other txn, locks string) (txErr, otherErr error) {
	var txID uint64
	if err := tx.QueryRowContext(ctx, e.CycleCloser.TxID).Scan(&txID); err != nil {
		_ = other.Rollback()
		return err, nil
	}
	otherDone := make(chan error, 1)
	go func() {
		if _, err := other.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 1"); err != nil {
			_ = other.Rollback()
			otherDone <- fmt.Errorf("the other transaction: %w", err)
			return
		}
		otherDone <- other.Commit()
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting int
		err := e.db.QueryRowContext(ctx, e.rebind(e.CycleCloser.WaitsOn), txID).Scan(&waiting)
		if err != nil {
			return err, nil // the caller rolls tx back, which lets other finish
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the other transaction did not wait for row 1 within 10 s"), nil
		}
	}
	_, txErr = tx.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 2")
	return txErr, <-otherDone
}

// wantOneResult fails unless key has exactly one business row, the stored
// response is the one of the execution that wrote it, and last (what the
// client got in the end) is that response.
func (o *op) wantOneResult(s *store, key string, last idem.Result) {
	e := o.e
	e.t.Helper()
	var (
		stored []byte // a bytea, which pgx scans into bytes only
		run    string
	)
	must(e.t, e.db.QueryRow(e.rebind("SELECT response_body FROM "+s.Table()+" WHERE idem_key = ?"), key).Scan(&stored))
	if n := e.count(o.biz, key); n != 1 {
		e.t.Fatalf("fn ran %d times, %d business rows for %s; want 1", o.calls.Load(), n, key)
	}
	must(e.t, e.db.QueryRow(e.rebind("SELECT v FROM "+o.biz+" WHERE k = ?"), key).Scan(&run))
	if want := fmt.Sprintf(`"run":%s}`, strings.TrimPrefix(run, "run-")); !strings.HasSuffix(string(stored), want) || string(last.Body) != string(stored) {
		e.t.Fatalf("the committed business row is %s, the stored response %s, the client got %s (replayed %v); want one execution's", run, stored, last.Body, last.Replayed)
	}
}

// escape runs req through RunTx and Do. On the first attempt fn writes its
// business row, then end makes the database end the transaction under it,
// starting a duplicate of req (duplicate) that runs and commits; fn then
// returns end's error, or swallows it (swallow) and returns its response.
// It returns the last result, the first attempt's error from Do, and
// RunTx's error.
func (o *op) escape(t *testing.T, s *store, db pool, req idem.Request, swallow bool,
	end func(tx txn, duplicate func()) error) (last idem.Result, first, err error) {
	t.Helper()
	dupDone := make(chan error, 1)
	attempts := 0
	err = runTx(ctx, db, nil, func(tx txn) error {
		attempts++
		var err error
		last, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			resp, err := o.fn(tx, req.Key)(ctx)
			if err != nil || attempts > 1 {
				return resp, err
			}
			endErr := end(tx, func() {
				go func() {
					_, err := o.do(s, req)
					dupDone <- err
				}()
			})
			must(t, <-dupDone)
			if swallow {
				return resp, nil
			}
			return idem.Response{}, endErr
		})
		if attempts == 1 {
			first = err
		}
		return err
	})
	return last, first, err
}

// Defect: a deadlock inside fn ends the transaction on MySQL (InnoDB rolls
// it back whole) while the *sql.Tx stays open, so what Do runs after fn
// would run in autocommit, after a duplicate has won the key and
// completed. Do's clean-up and its completion are fenced on its claim's
// token: they change nothing then, and Do says the transaction is gone,
// with an error RunTx retries; the retry replays the duplicate's result.
// fn returns the deadlock (the "failed" case) or swallows it and returns
// a response anyway (the "swallowed" case). Where an error aborts the
// transaction (ErrorAborts: Postgres) it stays open and aborted, and the
// duplicate waits for its rollback; the outcome must be the same: one
// business row, one result.
func testDeadlockInFn(t *testing.T) {
	for _, swallow := range []bool{false, true} {
		name := map[bool]string{false: "failed", true: "swallowed"}[swallow]
		t.Run(name, func(t *testing.T) {
			forEach(t, func(t *testing.T, e *env) {
				e.needServer("deadlock between sessions")
				e = e.onOneNode()
				s, o := e.store(), e.op()
				locks := e.lockRows(20)
				req := charge("deadlocked-"+name, "100")
				last, first, err := o.escape(t, s, e.db, req, swallow, func(tx txn, duplicate func()) error {
					txErr, otherErr := e.deadlock(tx, locks)
					must(t, otherErr)
					if !idem.IsRetryable(txErr) {
						t.Fatalf("fn's transaction: %v, want a deadlock", txErr)
					}
					// The database ended the transaction and let its locks go
					// (Postgres too, though it keeps the transaction open,
					// aborted): the duplicate runs and commits.
					duplicate()
					return txErr
				})
				if first != nil && !(swallow && e.ErrorAborts) {
					if !idem.IsRetryable(first) {
						t.Errorf("Do after the deadlock: %v; want an error RunTx retries", first)
					}
					if !e.ErrorAborts && !strings.Contains(first.Error(), "rolled back") {
						t.Errorf("Do after the deadlock: %v; want it to say the transaction was rolled back", first)
					}
				}
				if swallow && e.ErrorAborts {
					// The database aborted the transaction at the deadlock
					// and fn hid the cause: Do cannot tell that a retry
					// would help, and says the transaction is aborted. The
					// client's own retry then replays.
					if err == nil || !strings.Contains(err.Error(), "aborted") {
						t.Fatalf("Do after fn swallowed the deadlock: %v; want an error saying the transaction is aborted", err)
					}
					last, err = o.do(s, req)
				}
				must(t, err)
				o.wantOneResult(s, req.Key, last)
			})
		})
	}
}

// Defect: on SQLite an interrupted write (its context's deadline passed)
// inside an explicit transaction rolls the whole transaction back, and the
// *sql.Tx stays open: the same escape as a deadlock on MySQL. A duplicate
// waiting at BEGIN wins the key and completes before fn returns.
func testInterruptInFn(t *testing.T) {
	forDialect(t, idem.SQLite, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		for _, swallow := range []bool{false, true} {
			req := charge(fmt.Sprintf("interrupted-%v", swallow), "100")
			last, first, err := o.escape(t, s, e.db, req, swallow, func(tx txn, duplicate func()) error {
				duplicate()
				time.Sleep(100 * time.Millisecond) // the duplicate waits at BEGIN
				short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				_, werr := tx.ExecContext(short, "INSERT INTO "+o.biz+" (k, v) "+
					"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000000) SELECT 'junk', x FROM c")
				if werr == nil {
					t.Fatalf("the long write was not interrupted")
				}
				return werr
			})
			if first != nil && (!idem.IsRetryable(first) || !strings.Contains(first.Error(), "rolled back")) {
				t.Errorf("Do after the interrupt: %v; want a retryable error saying the transaction was rolled back", first)
			}
			must(t, err)
			if !last.Replayed {
				t.Fatalf("swallow=%v: the retry returned %q, not the duplicate's result replayed", swallow, last.Body)
			}
			o.wantOneResult(s, req.Key, last)
		}
	})
}

// Defect: Begin's lease was computed when its claim statement started; a
// statement that waited longer than the lease for a transaction holding
// the key (a Do whose fn then failed) committed a claim already expired.
// A claim's lease counts from when it is granted.
func testBeginLeaseCountsFromGrant(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		lease := time.Second
		s := e.store(idem.WithLease(lease))
		req := charge("born-expired", "100")
		holder := e.begin(nil)
		_, err := s.Do(ctx, holder, req, ok)
		must(t, err)
		type begun struct {
			c   *claim
			r   *idem.Result
			err error
		}
		done := make(chan begun, 1)
		go func() {
			c, r, err := s.Begin(ctx, e.db, req)
			done <- begun{c, r, err}
		}()
		waitBlocked(e, s.Table(), done)
		time.Sleep(lease + lease/2)
		must(t, holder.Rollback())
		first := <-done
		if first.err != nil || first.c == nil {
			t.Fatalf("Begin after the holder rolled back: %+v; want a claim", first)
		}
		_, _, err = s.Begin(ctx, e.db, req)
		wantInFlight(t, err, time.Second, time.Second)
		must(t, runTx(ctx, e.db, nil, func(tx txn) error {
			return first.c.Complete(ctx, tx, idem.Response{StatusCode: 201})
		}))
	})
}

// Defect: with WithLockTimeout on Postgres, Do on a transaction that an
// earlier error aborted returned the driver's error bare; it says what
// idem was doing, for which key, and what to do, as without the option.
func testAbortedTxMessage(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		for _, opts := range [][]idem.Option{nil, {idem.WithLockTimeout(time.Second)}} {
			s := e.store(opts...)
			req := charge("aborted-tx", "100")
			tx := e.begin(nil)
			if _, err := tx.Exec("SELECT 1 / 0"); err == nil {
				t.Fatal("SELECT 1 / 0: no error")
			}
			_, err := s.Do(ctx, tx, req, ok)
			if err == nil || !strings.HasPrefix(err.Error(), "idem: ") || !strings.Contains(err.Error(), req.Key) ||
				!strings.Contains(told(err), "roll back") {
				t.Errorf("with %d options: Do on an aborted transaction: %v; want idem's message naming the key, and a hint to roll back", len(opts), err)
			}
			var state interface{ SQLState() string }
			if !errors.As(err, &state) || state.SQLState() != "25P02" {
				t.Errorf("with %d options: %v does not wrap the driver's error", len(opts), err)
			}
			must(t, tx.Rollback())
		}
	})
}
