package conformance

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The fault-injection history: its shape. Its length is historyParams'
// (IDEM_SOAK, IDEM_SEED), as for TestRandomHistory.
const (
	faultWorkers = 6
	faultWindow  = 4 // keys in play at once; every epoch brings four new ones
	faultStep    = 4
	faultEpoch   = 100 * time.Millisecond
	faultLease   = 300 * time.Millisecond
)

// The ways a database ends a statement or a transaction under the
// caller, which Facts.Faults names (TestFaultHistory injects them).
const (
	FaultDeadlock      = "deadlock victim"       // MySQL 1213, Postgres 40P01
	FaultSerialization = "serialization failure" // Postgres 40001 under REPEATABLE READ
	FaultTimeout       = "statement timeout"     // Postgres statement_timeout, MariaDB max_statement_time: TimeoutQueries
	FaultInterrupt     = "interrupted write"     // SQLite: the context's deadline passes mid-write
	FaultKill          = "backend terminated"    // pg_terminate_backend, MySQL KILL
	FaultCut           = "connection dropped"    // the proxy cuts the connection at COMMIT
)

// Where in an operation the history injects them.
const (
	pointBeforeWrite = "in fn, before its write"
	pointAfterWrite  = "in fn, after its write"
	pointAfterDo     = "after Do, before COMMIT"
)

// faultRun is one target's fault-injection history.
type faultRun struct {
	e       *env
	s       *store
	biz     string
	junk    string // what an interrupted write writes into (SQLite)
	proxy   *proxy
	proxied pool

	mu         sync.Mutex
	keys       map[string]bool
	seen       map[string][]string // key -> bodies clients saw as executed or replayed
	outcomes   map[string]int
	faults     map[string]int
	points     map[string]int
	unexpected []error
}

func (r *faultRun) note(m map[string]int, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m[what]++
}

// Many workers run operations over a small moving window of keys through
// RunTx and Do, and through Begin and Complete, while, at random points in
// and around fn, the database ends a statement or the whole transaction
// under them: a deadlock, a serialization failure, a timeout or an
// interrupt, a terminated backend, a dropped connection. fn sometimes
// returns the error and sometimes swallows it, answering as if its write
// had worked. Then, per key: at most one business row; a completed record
// exactly when one committed, holding the response of the execution that
// wrote it; every execution or replay a client saw is that response.
func testFaultHistory(t *testing.T) {
	d, seed := historyParams(t)
	forEach(t, func(t *testing.T, e *env) {
		r := &faultRun{
			e: e, s: e.store(idem.WithLease(faultLease)), biz: e.business(), junk: e.business(),
			keys: map[string]bool{}, seen: map[string][]string{},
			outcomes: map[string]int{}, faults: map[string]int{}, points: map[string]int{},
		}
		if !e.embedded() {
			r.proxy = e.startProxy()
			r.proxied = r.proxy.open(e, 2)
		}
		locks := make([]string, faultWorkers)
		if !e.embedded() {
			for i := range locks {
				locks[i] = e.lockRows(20)
			}
		}
		start := time.Now()
		deadline := start.Add(d)
		var wg sync.WaitGroup
		for i := range faultWorkers {
			wg.Go(func() { r.worker(i, locks[i], mrand.New(mrand.NewPCG(seed, uint64(100+i))), start, deadline) })
		}
		wg.Wait()
		for _, err := range r.unexpected {
			t.Errorf("unexpected: %v", err)
		}
		committed, checked := r.check(t)
		ops, faults := 0, 0
		for _, n := range r.outcomes {
			ops += n
		}
		for _, n := range r.faults {
			faults += n
		}
		t.Logf("seed %d, %v: %d operations (%s); %d faults (%s) at (%s); %d keys, %d committed, %d observations checked",
			seed, d, ops, summary(r.outcomes), faults, summary(r.faults), summary(r.points), len(r.keys), committed, checked)
	})
}

func (r *faultRun) worker(id int, locks string, rng *mrand.Rand, start, deadline time.Time) {
	for time.Now().Before(deadline) {
		k := int(time.Since(start)/faultEpoch)*faultStep + rng.IntN(faultWindow)
		key := fmt.Sprintf("f-%d", k)
		r.mu.Lock()
		r.keys[key] = true
		r.mu.Unlock()
		req := idem.Request{Scope: "faults", Key: key, Operation: "POST /v1/charges", Fingerprint: idem.Fingerprint([]byte(key))}
		kind, point := "", ""
		if rng.IntN(2) == 0 {
			kind = r.e.Faults[rng.IntN(len(r.e.Faults))]
			points := []string{pointBeforeWrite, pointBeforeWrite, pointAfterWrite, pointAfterWrite, pointAfterDo}
			point = points[rng.IntN(len(points))]
		}
		swallow := point == pointAfterWrite && rng.IntN(3) == 0
		if rng.IntN(5) == 0 {
			r.begin(req, kind, locks)
		} else {
			r.do(req, kind, point, swallow, locks)
		}
	}
}

// execID is a fresh random id for one execution of fn.
func execID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// txFor returns the database and transaction options an operation that
// injects kind runs its transaction with: through the proxy that cuts
// connections, or at REPEATABLE READ to meet a serialization failure.
func (r *faultRun) txFor(kind string) (pool, *sql.TxOptions) {
	switch kind {
	case FaultCut:
		return r.proxied, nil
	case FaultSerialization:
		return r.e.db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	}
	return r.e.db, nil
}

// do runs one operation through RunTx and Do, injecting kind at point on
// its first attempt.
func (r *faultRun) do(req idem.Request, kind, point string, swallow bool, locks string) {
	db, opts := r.txFor(kind)
	attempt := 0
	var (
		res  idem.Result
		mine string
	)
	err := runTx(ctx, db, opts, func(tx txn) error {
		attempt++
		inject := func(at string) error {
			if attempt > 1 || kind == "" || at != point {
				return nil
			}
			return r.inject(tx, kind, point, locks)
		}
		var err error
		res, err = r.s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			if err := inject(pointBeforeWrite); err != nil {
				return idem.Response{}, err
			}
			id := execID()
			if err := r.e.insertRow(tx, r.biz, req.Key, id); err != nil {
				return idem.Response{}, err
			}
			mine = id
			resp := idem.Response{StatusCode: 201, Body: []byte(id)}
			if err := inject(pointAfterWrite); err != nil && !swallow {
				return idem.Response{}, err
			}
			return resp, nil
		})
		if err != nil {
			return err
		}
		return inject(pointAfterDo)
	})
	if err == nil && !res.Replayed && string(res.Body) != mine {
		err = fmt.Errorf("Do returned %q for its own execution %q", res.Body, mine)
	}
	r.outcome(req, err, &res, kind != "")
}

// begin runs Begin, then Complete in a business transaction through RunTx,
// injecting kind into that transaction's first attempt before Complete.
func (r *faultRun) begin(req idem.Request, kind, locks string) {
	c, replay, err := r.s.Begin(ctx, r.e.db, req)
	if err != nil || replay != nil {
		r.outcome(req, err, replay, false)
		return
	}
	db, opts := r.txFor(kind)
	id := execID()
	attempt := 0
	err = runTx(ctx, db, opts, func(tx txn) error {
		attempt++
		if err := r.e.insertRow(tx, r.biz, req.Key, id); err != nil {
			return err
		}
		if attempt == 1 && kind != "" {
			if err := r.inject(tx, kind, "before Complete", locks); err != nil {
				return err
			}
		}
		return c.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte(id)})
	})
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) && kind != "" {
		// The fault left the claim: give it back, as a caller that
		// gives up would, or leave it to its lease.
		_ = c.Release(ctx, r.e.db)
	}
	r.outcome(req, err, &idem.Result{Response: idem.Response{Body: []byte(id)}}, kind != "")
}

// inject makes the database end a statement or the transaction tx under
// the caller, and returns the error the caller's statement got (nil for a
// dropped connection, which strikes at COMMIT).
func (r *faultRun) inject(tx txn, kind, point string, locks string) error {
	r.note(r.faults, kind)
	r.note(r.points, point)
	e := r.e
	switch kind {
	case FaultDeadlock:
		txErr, otherErr := e.deadlock(tx, locks)
		return errors.Join(txErr, otherErr)
	case FaultSerialization:
		if _, err := tx.ExecContext(ctx, "SELECT n FROM "+locks+" WHERE id = 1"); err != nil {
			return err
		}
		if _, err := e.db.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 1"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE "+locks+" SET n = n + 1 WHERE id = 1")
		return err
	case FaultTimeout:
		for _, q := range e.TimeoutQueries {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	case FaultInterrupt:
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := tx.ExecContext(short, "INSERT INTO "+r.junk+" (k, v) "+
			"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000000) SELECT 'junk', x FROM c")
		return err
	case FaultKill:
		id, err := e.sessionID(tx)
		if err != nil {
			return err
		}
		if err := e.killSession(id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "SELECT 1")
		return err
	case FaultCut:
		r.proxy.arm([]int32{loseCommit, loseCommitReply}[mrand.IntN(2)])
		return nil
	}
	return fmt.Errorf("no fault %q", kind)
}

// outcome records what a client saw.
func (r *faultRun) outcome(req idem.Request, err error, res *idem.Result, fault bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil && res.Replayed:
		r.seen[req.Key] = append(r.seen[req.Key], string(res.Body))
		r.outcomes["replayed"]++
	case err == nil:
		r.seen[req.Key] = append(r.seen[req.Key], string(res.Body))
		r.outcomes["executed"]++
	case errors.Is(err, idem.ErrInFlight):
		r.outcomes["in flight"]++
	case errors.Is(err, idem.ErrLeaseLost):
		r.outcomes["lease lost"]++
	case fault:
		r.outcomes["failed by the fault"]++
	case idem.IsRetryable(err):
		r.outcomes["gave up retrying"]++
	default:
		r.unexpected = append(r.unexpected, fmt.Errorf("key %s: %w", req.Key, err))
	}
}

// check verifies the invariants per key; it returns how many keys
// committed an execution and how many client observations it checked.
func (r *faultRun) check(t *testing.T) (committed, checked int) {
	e := r.e
	for key := range r.keys {
		o := e.committed(t, r.s, r.biz, key)
		completed, status, stored := o.completed(), o.status, o.stored
		if completed {
			committed++
		}
		for _, b := range r.seen[key] {
			checked++
			if !completed || b != string(stored) {
				t.Errorf("%s: a client got %q, but the record is %q with %q", key, b, status, stored)
			}
		}
	}
	return committed, checked
}
