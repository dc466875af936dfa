// The scenarios the demo plays: a burst of retries, a late retry, the
// same key with another amount, a worker that dies, a takeover and a
// zombie; each plays idem's payment and the naive one and checks idem's
// invariants. Also the payment with idem and the helpers that run and
// count requests.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

func (d *demo) scenarios() []scenario {
	return []scenario{
		{fmt.Sprintf("burst: %d concurrent retries", d.burst), (*demo).burstScenario},
		{"retry during a 500 ms payment", (*demo).lateRetryScenario},
		{"same key, another amount", (*demo).otherAmountScenario},
		{"worker dies before responding", (*demo).diesScenario},
		{"worker dies after claiming", (*demo).takeoverScenario},
		{"zombie returns after takeover", (*demo).zombieScenario},
	}
}

// request is a charge of amount (in cents) under key.
func request(key string, amount int) idem.Request {
	return idem.Request{
		Scope:       "demo-merchant",
		Key:         key,
		Operation:   "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte(strconv.Itoa(amount))),
	}
}

// chargeBody is the response of a charge.
func (d *demo) chargeBody(amount int) string {
	return fmt.Sprintf(`{"charge":"ch_%d","amount":%d}`, d.seq.Add(1), amount)
}

// errDied stands for a process that dies mid-request: its transaction
// rolls back, as the database rolls back a dead connection's.
var errDied = errors.New("the worker died")

// pay makes a payment with idem: the charge row and the key's record are
// written in one transaction. The provider takes latency; die makes the
// worker die after charging, before the response is stored.
func (d *demo) pay(ctx context.Context, key string, amount int, latency time.Duration, die bool) (idem.Result, error) {
	var res idem.Result
	err := idem.RunTx(ctx, d.db, nil, func(tx *sql.Tx) error {
		var err error
		res, err = d.store.Do(ctx, tx, request(key, amount), func(ctx context.Context) (idem.Response, error) {
			if _, err := tx.ExecContext(ctx, d.q("INSERT INTO "+d.charges+" (idem_key, amount) VALUES (?, ?)"), key, amount); err != nil {
				return idem.Response{}, err
			}
			time.Sleep(latency)
			if die {
				return idem.Response{}, errDied
			}
			return idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
				Body: []byte(d.chargeBody(amount))}, nil
		})
		return err
	})
	return res, err
}

// concurrently starts n calls of fn at once and returns their errors.
func concurrently(n int, fn func() error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			if err := fn(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return errors.Join(errs...)
}

// overlap is a client that retries while its first request still runs:
// first in the background, retry delay later. It returns both errors.
func overlap(delay time.Duration, first, retry func() error) error {
	done := make(chan error, 1)
	go func() { done <- first() }()
	time.Sleep(delay)
	err := retry()
	return errors.Join(err, <-done)
}

// tally counts the charges under key: those made with idem, in withIdem,
// and those the naive design made.
func (d *demo) tally(ctx context.Context, withIdem, key string) (n, naive int, err error) {
	if n, err = d.count(ctx, withIdem, key); err != nil {
		return 0, 0, err
	}
	naive, err = d.count(ctx, d.naiveCharges, key)
	return n, naive, err
}

// count returns the charges made under key in table.
func (d *demo) count(ctx context.Context, table, key string) (int, error) {
	var n int
	err := d.db.QueryRowContext(ctx, d.q("SELECT COUNT(*) FROM "+table+" WHERE idem_key = ?"), key).Scan(&n)
	return n, err
}

func charges(n int) string { return plural(n, "charge") }

// lock is the lock a duplicate of a running request waits on: the row's
// on a server, SQLite's one write lock (BEGIN IMMEDIATE) on SQLite.
func (d *demo) lock() string {
	if d.t.Dialect == idem.SQLite {
		return "the write lock"
	}
	return "the row lock"
}

func (d *demo) burstScenario(ctx context.Context, key string) (outcome, error) {
	const latency = 50 * time.Millisecond
	var (
		mu       sync.Mutex
		bodies   = map[string]int{}
		replayed int
	)
	err := concurrently(d.burst, func() error {
		res, err := d.pay(ctx, key, 1000, latency, false)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		bodies[string(res.Body)]++
		if res.Replayed {
			replayed++
		}
		return nil
	})
	if err != nil {
		return outcome{}, err
	}
	if err := concurrently(d.burst, d.naiveRequest(ctx, key, latency)); err != nil {
		return outcome{}, err
	}
	n, naive, err := d.tally(ctx, d.charges, key)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{
		idem:  charges(n) + ", " + plural(replayed, "replay"),
		naive: charges(naive),
		why:   d.lock() + ": duplicates queued behind the first, then replayed",
	}
	switch {
	case n != 1:
		o.broken = fmt.Errorf("%d charges, want 1", n)
	case len(bodies) != 1 || replayed != d.burst-1:
		o.broken = fmt.Errorf("%d distinct responses and %d replays, want 1 and %d", len(bodies), replayed, d.burst-1)
	}
	return o, nil
}

func (d *demo) lateRetryScenario(ctx context.Context, key string) (outcome, error) {
	const latency, delay = 500 * time.Millisecond, 100 * time.Millisecond
	var (
		first, retry idem.Result
		waited       time.Duration
	)
	err := overlap(delay, func() (err error) {
		first, err = d.pay(ctx, key, 1000, latency, false)
		return err
	}, func() (err error) {
		began := time.Now()
		retry, err = d.pay(ctx, key, 1000, latency, false)
		waited = time.Since(began)
		return err
	})
	if err != nil {
		return outcome{}, err
	}
	if err := overlap(delay, d.naiveRequest(ctx, key, latency), d.naiveRequest(ctx, key, latency)); err != nil {
		return outcome{}, err
	}
	n, naive, err := d.tally(ctx, d.charges, key)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{
		idem:  charges(n) + ", retry replayed",
		naive: charges(naive),
		why:   fmt.Sprintf("%s: the retry waited %s for the first, replayed", d.lock(), waited.Round(10*time.Millisecond)),
	}
	if first.Replayed {
		// On a loaded machine the retry can reach the database first:
		// then it runs and the first request replays, as it should.
		o.idem = charges(n) + ", first replayed"
		o.why = d.lock() + ": the first request queued behind the retry, replayed"
	}
	switch {
	case n != 1:
		o.broken = fmt.Errorf("%d charges, want 1", n)
	case first.Replayed == retry.Replayed || string(retry.Body) != string(first.Body):
		o.broken = fmt.Errorf("responses %q (replayed %v) and %q (replayed %v), want one response, replayed once",
			first.Body, first.Replayed, retry.Body, retry.Replayed)
	}
	return o, nil
}

func (d *demo) otherAmountScenario(ctx context.Context, key string) (outcome, error) {
	if _, err := d.pay(ctx, key, 1000, 0, false); err != nil {
		return outcome{}, err
	}
	_, mismatch := d.pay(ctx, key, 2500, 0, false)
	if mismatch != nil && !errors.Is(mismatch, idem.ErrMismatch) {
		return outcome{}, mismatch
	}

	if _, _, err := d.naivePay(ctx, key, 1000, 0, false); err != nil {
		return outcome{}, err
	}
	body, replayed, err := d.naivePay(ctx, key, 2500, 0, false)
	if err != nil {
		return outcome{}, err
	}
	naive := "charged 25.00"
	if replayed && strings.Contains(body, `"amount":1000`) {
		naive = "wrong receipt" // the 10.00 one, for the 25.00 request
	}

	rows, err := d.db.QueryContext(ctx, d.q("SELECT amount FROM "+d.charges+" WHERE idem_key = ?"), key)
	if err != nil {
		return outcome{}, err
	}
	var amounts []int
	for rows.Next() {
		var a int
		if err := rows.Scan(&a); err != nil {
			rows.Close()
			return outcome{}, err
		}
		amounts = append(amounts, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return outcome{}, err
	}
	o := outcome{idem: "422; 1 charge of 10.00", naive: naive,
		why: "the fingerprint: the key is bound to the 10.00 request's payload"}
	switch {
	case mismatch == nil:
		o.broken = errors.New("the 25.00 request under a used key was not refused")
	case len(amounts) != 1 || amounts[0] != 1000:
		o.broken = fmt.Errorf("charges %v, want one of 1000", amounts)
	}
	return o, nil
}

func (d *demo) diesScenario(ctx context.Context, key string) (outcome, error) {
	if _, err := d.pay(ctx, key, 1000, 0, true); !errors.Is(err, errDied) {
		return outcome{}, fmt.Errorf("the dying worker: %v", err)
	}
	retry, err := d.pay(ctx, key, 1000, 0, false)
	if err != nil {
		return outcome{}, err
	}
	if err := d.naiveDiesThenRetries(ctx, key); err != nil {
		return outcome{}, err
	}
	n, naive, err := d.tally(ctx, d.charges, key)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{
		idem:  "rolled back; " + charges(n),
		naive: charges(naive),
		why:   "one transaction: the charge rolled back with the claim; retry ran",
	}
	switch {
	case n != 1:
		o.broken = fmt.Errorf("%d charges, want 1", n)
	case retry.Replayed:
		o.broken = errors.New("the retry replayed a response nobody stored")
	}
	return o, nil
}

func (d *demo) takeoverScenario(ctx context.Context, key string) (outcome, error) {
	req := request(key, 1000)
	dead, err := d.claimAndCall(ctx, req)
	if err != nil {
		return outcome{}, err
	}
	// The worker dies here: no Complete, no Release. A retry at once is
	// told to come back later.
	_, _, early := d.claims.Begin(ctx, d.db, req)
	var inflight *idem.InFlightError
	if early != nil && !errors.As(early, &inflight) {
		return outcome{}, early
	}
	c, err := d.takeOver(ctx, req, d.chargeBody(1000))
	if err != nil {
		return outcome{}, err
	}

	if err := d.naiveDiesThenRetries(ctx, key); err != nil {
		return outcome{}, err
	}
	n, naive, err := d.tally(ctx, d.provider, key)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{
		idem:  "409, took over; " + charges(n),
		naive: charges(naive),
		why:   "the lease: 409 until it ran out; one relay key for the provider",
	}
	switch {
	case inflight == nil:
		o.broken = errors.New("a retry during the dead worker's lease was not told 409")
	case c.Token() <= dead.Token():
		o.broken = fmt.Errorf("takeover token %d, not above the dead claim's %d", c.Token(), dead.Token())
	case c.RelayKey() != dead.RelayKey():
		o.broken = errors.New("the takeover passed the provider another relay key")
	case n != 1:
		o.broken = fmt.Errorf("the provider charged %d times, want 1", n)
	}
	return o, nil
}

func (d *demo) zombieScenario(ctx context.Context, key string) (outcome, error) {
	req := request(key, 1000)
	zombie, err := d.claimAndCall(ctx, req)
	if err != nil {
		return outcome{}, err
	}
	// The worker stalls (a GC pause, a partition) past its lease; a retry
	// takes the key over and completes.
	winner := d.chargeBody(1000)
	if _, err := d.takeOver(ctx, req, winner); err != nil {
		return outcome{}, err
	}
	// The zombie comes back and completes with a response of its own.
	late := d.complete(ctx, zombie, key, d.chargeBody(1000))
	if late != nil && !errors.Is(late, idem.ErrLeaseLost) {
		return outcome{}, late
	}
	_, stored, err := d.claims.Begin(ctx, d.db, req)
	if err != nil {
		return outcome{}, err
	}

	// The naive design has no lease to outlive: its worker charges and
	// stalls, the client retries after the same wait, and the retry
	// charges again.
	if err := overlap(demoLease+50*time.Millisecond, d.naiveRequest(ctx, key, demoLease+200*time.Millisecond), d.naiveRequest(ctx, key, 0)); err != nil {
		return outcome{}, err
	}
	n, naive, err := d.tally(ctx, d.charges, key)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{
		idem:  "fenced out; " + charges(n),
		naive: charges(naive),
		why:   "the fencing token: the takeover raised it; the zombie's was stale",
	}
	switch {
	case late == nil:
		o.broken = errors.New("the zombie's late Complete was accepted")
	case n != 1:
		o.broken = fmt.Errorf("%d charges recorded, want 1", n)
	case stored == nil || string(stored.Body) != winner:
		o.broken = fmt.Errorf("stored response %v, want the winner's %q", stored, winner)
	}
	return o, nil
}
