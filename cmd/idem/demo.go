package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		dsn   string
		burst int
	)
	fs := newFlags("demo", "[--dsn DSN] [--burst 16]",
		"Acts out the failures idem exists for, each twice on the same database: with\n"+
			"idem, and with a naive design that caches responses (check the cache, run,\n"+
			"store the response, no transaction in common). Prints a line per scenario\n"+
			"and a closing table. Without --dsn it uses an embedded SQLite database in a\n"+
			"temporary directory and needs no server. It works on tables of its own,\n"+
			"dropped at the end. Exit code 1 if an invariant of idem breaks.", stderr)
	fs.StringVar(&dsn, "dsn", "", "run on this database instead: postgres://..., mysql://... (see idem help)")
	fs.IntVar(&burst, "burst", 16, "concurrent retries in the burst scenario (2..40)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if burst < 2 || burst > 40 {
		return usageErr("demo: --burst must be between 2 and 40, got %d", burst)
	}
	if dsn == "" {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = "sqlite:" + filepath.Join(dir, "demo.db")
	}
	t, err := parseDSN(ctx, dsn)
	if err != nil {
		return err
	}
	t = withWAL(t)
	db, err := connect(ctx, t)
	if err != nil {
		return err
	}
	defer db.Close()
	d, err := newDemo(ctx, db, t, burst)
	if err != nil {
		return err
	}
	defer d.drop()
	fmt.Fprintf(stdout, "idem demo on %s, tables %s*\n\n", t.where, d.prefix)
	return d.run(ctx, stdout)
}

// demo holds the tables of one run: idem's, the charges idem guards, and
// the naive design's cache and charges.
type demo struct {
	db     *sql.DB
	t      target
	bind   int // sqlx bind type for the driver
	burst  int
	prefix string
	store  *idem.Store
	claims *idem.Store  // the same table, with a short lease, for Begin
	seq    atomic.Int64 // charge ids
	// The charges idem guards, the naive design's cache and charges, and
	// the payment provider's charges.
	charges, naiveCache, naiveCharges, provider string
}

func newDemo(ctx context.Context, db *sql.DB, t target, burst int) (*demo, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := "idem_demo_" + hex.EncodeToString(b) + "_"
	store, err := idem.New(t.dialect, idem.WithTable(p+"keys"))
	if err != nil {
		return nil, err
	}
	claims, err := idem.New(t.dialect, idem.WithTable(p+"keys"), idem.WithLease(demoLease))
	if err != nil {
		return nil, err
	}
	d := &demo{
		db: db, t: t, bind: sqlx.BindType(t.driver), burst: burst, prefix: p,
		store: store, claims: claims,
		charges: p + "charges", naiveCache: p + "naive_cache", naiveCharges: p + "naive_charges",
		provider: p + "provider",
	}
	if err := d.store.Migrate(ctx, db); err != nil {
		d.drop()
		return nil, err
	}
	for _, stmt := range []string{
		"CREATE TABLE " + d.charges + " (idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
		"CREATE TABLE " + d.naiveCharges + " (idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
		"CREATE TABLE " + d.naiveCache + " (idem_key VARCHAR(255) NOT NULL PRIMARY KEY, body VARCHAR(1000) NOT NULL)",
		"CREATE TABLE " + d.provider + " (provider_key VARCHAR(255) NOT NULL PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			d.drop()
			return nil, fmt.Errorf("demo: create its tables: %w", err)
		}
	}
	return d, nil
}

// drop removes the demo's tables, whatever happened.
func (d *demo) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range []string{d.store.Table(), d.charges, d.naiveCache, d.naiveCharges, d.provider} {
		_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
	}
}

func (d *demo) q(query string) string { return sqlx.Rebind(d.bind, query) }

// outcome is what one scenario found: a line for each design, and the
// broken invariant of idem, if any.
type outcome struct {
	idem, naive string
	broken      error
}

// scenario is one failure story, played with idem and with the naive cache.
type scenario struct {
	title string
	run   func(d *demo, ctx context.Context, key string) (outcome, error)
}

func (d *demo) scenarios() []scenario {
	return []scenario{
		{fmt.Sprintf("burst: %d concurrent retries", d.burst), (*demo).burstScenario},
		{"retry 100 ms into a 500 ms payment", (*demo).lateRetryScenario},
		{"same key, another amount", (*demo).otherAmountScenario},
		{"worker dies before responding", (*demo).diesScenario},
		{"worker dies after claiming", (*demo).takeoverScenario},
		{"zombie returns after takeover", (*demo).zombieScenario},
	}
}

func (d *demo) run(ctx context.Context, stdout io.Writer) error {
	scs := d.scenarios()
	type row struct {
		title string
		outcome
	}
	var rows []row
	broken := 0
	for i, sc := range scs {
		fmt.Fprintf(stdout, "[%d/%d] %s ... ", i+1, len(scs), sc.title)
		start := time.Now()
		o, err := sc.run(d, ctx, fmt.Sprintf("pay-%d", i+1))
		if err != nil {
			fmt.Fprintln(stdout, "error")
			return fmt.Errorf("demo: %s: %w", sc.title, err)
		}
		verdict := "ok"
		if o.broken != nil {
			verdict = "INVARIANT BROKEN: " + o.broken.Error()
			broken++
		}
		fmt.Fprintf(stdout, "%s (%s)\n", verdict, time.Since(start).Round(time.Millisecond))
		rows = append(rows, row{sc.title, o})
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tWITH IDEM\tNAIVE RESPONSE CACHE\tIDEM OK")
	for _, r := range rows {
		ok := "yes"
		if r.broken != nil {
			ok = "NO"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.title, r.idem, r.naive, ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if broken > 0 {
		return failure("demo: %d of %d scenarios broke an invariant", broken, len(scs))
	}
	fmt.Fprintln(stdout, "Every invariant held: with idem, each payment was charged exactly once.")
	return nil
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

// naivePay is the design idem replaces: look the key up in a response
// cache; on a miss, charge, then store the response. Each statement
// commits on its own. It ignores a failure to store the response (another
// request stored one first), as such designs do.
func (d *demo) naivePay(ctx context.Context, key string, amount int, latency time.Duration, die bool) (body string, replayed bool, err error) {
	err = d.db.QueryRowContext(ctx, d.q("SELECT body FROM "+d.naiveCache+" WHERE idem_key = ?"), key).Scan(&body)
	if err == nil {
		return body, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return "", false, err
	}
	if _, err := d.db.ExecContext(ctx, d.q("INSERT INTO "+d.naiveCharges+" (idem_key, amount) VALUES (?, ?)"), key, amount); err != nil {
		return "", false, err
	}
	time.Sleep(latency)
	if die {
		return "", false, errDied
	}
	body = d.chargeBody(amount)
	_, _ = d.db.ExecContext(ctx, d.q("INSERT INTO "+d.naiveCache+" (idem_key, body) VALUES (?, ?)"), key, body)
	return body, false, nil
}

// naiveRequest is a payment of 10.00 under key with the naive design, as a
// function for concurrently and overlap.
func (d *demo) naiveRequest(ctx context.Context, key string, latency time.Duration) func() error {
	return func() error {
		_, _, err := d.naivePay(ctx, key, 1000, latency, false)
		return err
	}
}

// naiveDiesThenRetries plays, with the naive design, a worker that charges
// and dies before it stores the response, then the client's retry.
func (d *demo) naiveDiesThenRetries(ctx context.Context, key string) error {
	if _, _, err := d.naivePay(ctx, key, 1000, 0, true); !errors.Is(err, errDied) {
		return fmt.Errorf("the dying naive worker: %v", err)
	}
	return d.naiveRequest(ctx, key, 0)()
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

func charges(n int) string {
	if n == 1 {
		return "1 charge"
	}
	return fmt.Sprintf("%d charges", n)
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
		idem:  fmt.Sprintf("%s, %d replays", charges(n), replayed),
		naive: charges(naive),
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
		idem:  fmt.Sprintf("%s; retry waited %s, replayed", charges(n), waited.Round(10*time.Millisecond)),
		naive: charges(naive),
	}
	if first.Replayed {
		// On a loaded machine the retry can reach the database first:
		// then it runs and the first request replays, as it should.
		o.idem = fmt.Sprintf("%s; the retry came first, the first request replayed", charges(n))
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
	if replayed {
		naive = "25.00 request got the 10.00 receipt"
		if !strings.Contains(body, `"amount":1000`) {
			naive = "replayed " + body + " for the 25.00 request"
		}
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
	o := outcome{idem: "422 mismatch; 1 charge of 10.00", naive: naive}
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
		idem:  fmt.Sprintf("%s; the first rolled back, retry ran", charges(n)),
		naive: charges(naive),
	}
	switch {
	case n != 1:
		o.broken = fmt.Errorf("%d charges, want 1", n)
	case retry.Replayed:
		o.broken = errors.New("the retry replayed a response nobody stored")
	}
	return o, nil
}

// demoLease is the lease of the claim scenarios: short, so that the demo
// waits little for it to end.
const demoLease = 500 * time.Millisecond

// callProvider is a payment provider that honours its own idempotency key,
// as real ones do: a second call with one key charges nothing.
func (d *demo) callProvider(ctx context.Context, providerKey, key string) error {
	query := "INSERT INTO " + d.provider + " (provider_key, idem_key, amount) VALUES (?, ?, 1000) ON CONFLICT (provider_key) DO NOTHING"
	if d.t.dialect == idem.MySQL {
		query = "INSERT INTO " + d.provider + " (provider_key, idem_key, amount) VALUES (?, ?, 1000) ON DUPLICATE KEY UPDATE provider_key = provider_key"
	}
	_, err := d.db.ExecContext(ctx, d.q(query), providerKey, key)
	return err
}

// claimAndCall is the first worker of the claim scenarios, up to the
// provider's charge: Begin on a new key, then the provider called with the
// claim's relay key.
func (d *demo) claimAndCall(ctx context.Context, req idem.Request) (*idem.Claim, error) {
	c, replay, err := d.claims.Begin(ctx, d.db, req)
	if err != nil || replay != nil {
		return nil, fmt.Errorf("first Begin: claim %v, replay %v, %v", c, replay, err)
	}
	return c, d.callProvider(ctx, c.RelayKey(), req.Key)
}

// takeOver is the retry that outlives the first worker's lease: it calls
// Begin until the lease has run out and Begin takes the key over (for at
// most ten seconds), calls the provider with its relay key, and records
// the charge and completes with body in one transaction.
func (d *demo) takeOver(ctx context.Context, req idem.Request, body string) (*idem.Claim, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, replay, err := d.claims.Begin(ctx, d.db, req)
		switch {
		case c != nil:
			if err := d.callProvider(ctx, c.RelayKey(), req.Key); err != nil {
				return nil, err
			}
			return c, d.complete(ctx, c, req.Key, body)
		case replay != nil:
			return nil, errors.New("Begin replayed a response nobody stored")
		case !errors.Is(err, idem.ErrInFlight) || time.Now().After(deadline):
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// complete records the charge and completes the claim in one transaction.
func (d *demo) complete(ctx context.Context, c *idem.Claim, key, body string) error {
	return idem.RunTx(ctx, d.db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, d.q("INSERT INTO "+d.charges+" (idem_key, amount) VALUES (?, 1000)"), key); err != nil {
			return err
		}
		return c.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte(body)})
	})
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
		idem:  fmt.Sprintf("409 during the lease, then taken over; %s", charges(n)),
		naive: charges(naive),
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
		idem:  fmt.Sprintf("its late Complete fenced out; %s", charges(n)),
		naive: charges(naive),
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
