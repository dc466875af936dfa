package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The randomized history: its size, and how to make it longer.
const (
	historyClients = 8
	// Clients pick among historyWindow keys that move on by historyStep
	// keys every historyEpoch, so keys are fought over, completed, then
	// left behind. Only keys with an odd number are ever sent with a
	// second payload.
	historyWindow   = 6
	historyStep     = 4
	historyEpoch    = 250 * time.Millisecond
	historyLease    = 150 * time.Millisecond
	historyDuration = 3 * time.Second
	soakDuration    = time.Minute
)

// historyParams reads IDEM_SOAK (1 for a minute, or a Go duration) and
// IDEM_SEED (default 1).
func historyParams(t *testing.T) (time.Duration, uint64) {
	d, seed := historyDuration, uint64(1)
	switch v := os.Getenv("IDEM_SOAK"); v {
	case "", "0":
	case "1":
		d = soakDuration
	default:
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("IDEM_SOAK=%q: want 1 or a duration: %v", v, err)
		}
	}
	if v := os.Getenv("IDEM_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("IDEM_SEED=%q: %v", v, err)
		}
	}
	return d, seed
}

// history records what clients saw, for the checks at the end.
type history struct {
	mu         sync.Mutex
	successes  map[string][]string        // key -> bodies of executions the client saw commit
	replays    map[string][]string        // key -> bodies replayed
	mismatches map[string][]string        // key -> payloads told ErrMismatch
	keys       map[string]bool            // every key used
	claimed    map[string]map[string]bool // key -> payloads that may have held a claim
	outcomes   map[string]int             // outcome -> count
	faults     map[string]int             // fault -> count
	unexpected []error
}

func (h *history) add(m map[string][]string, key, v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m[key] = append(m[key], v)
}

func (h *history) count(m map[string]int, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m[what]++
}

func (h *history) claim(key, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.claimed[key] == nil {
		h.claimed[key] = map[string]bool{}
	}
	h.claimed[key][payload] = true
}

// historyRun is one target's run.
type historyRun struct {
	e     *env
	s     *store
	biz   string
	proxy *proxy
	h     *history
}

// Fault 5: many clients, overlapping keys, payloads reused at random,
// random kills, lost COMMITs, crashes after Begin and lease expiries. Then,
// per key: at most one business effect; exactly one when a client saw an
// execution commit; every success and replay byte-identical to the stored
// response; ErrMismatch only when a claim with another payload existed.
// The seed fixes each client's choices; the interleaving is the
// scheduler's. IDEM_SOAK=1 (or a duration) runs it longer.
func testRandomHistory(t *testing.T) {
	d, seed := historyParams(t)
	forEach(t, func(t *testing.T, e *env) {
		r := &historyRun{
			e: e, s: e.store(idem.WithLease(historyLease)), biz: e.business(),
			h: &history{
				successes: map[string][]string{}, replays: map[string][]string{}, mismatches: map[string][]string{},
				claimed: map[string]map[string]bool{}, keys: map[string]bool{}, outcomes: map[string]int{}, faults: map[string]int{},
			},
		}
		// On an embedded database there is no connection to cut or
		// session to kill: its history has the other faults only.
		proxied := e.db
		if !e.embedded() {
			r.proxy = e.startProxy()
			proxied = r.proxy.open(e, 2)
		}
		start := time.Now()
		deadline := start.Add(d)
		var wg sync.WaitGroup
		for i := range historyClients {
			db := e.db
			if i == 0 {
				db = proxied // the client whose COMMITs get lost
			}
			wg.Go(func() { r.client(i, db, rand.New(rand.NewPCG(seed, uint64(i))), start, deadline) })
		}
		wg.Wait()
		for _, err := range r.h.unexpected {
			t.Errorf("unexpected: %v", err)
		}
		checked := r.check(t)
		if r.proxy != nil {
			r.h.faults["commit cut"] = int(r.proxy.cuts.Load())
		}
		ops, faults := 0, 0
		for _, n := range r.h.outcomes {
			ops += n
		}
		for _, n := range r.h.faults {
			faults += n
		}
		t.Logf("seed %d, %v: %d operations (%s), %d faults (%s), %d keys and %d observations checked",
			seed, d, ops, summary(r.h.outcomes), faults, summary(r.h.faults), len(r.h.keys), checked)
	})
}

func summary(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func (r *historyRun) client(id int, db pool, rng *rand.Rand, start, deadline time.Time) {
	for n := 0; time.Now().Before(deadline); n++ {
		k := int(time.Since(start)/historyEpoch)*historyStep + rng.IntN(historyWindow)
		key, payload := fmt.Sprintf("h-%d", k), "A"
		if k%2 == 1 && rng.IntN(5) == 0 {
			payload = "B"
		}
		r.h.mu.Lock()
		r.h.keys[key] = true
		r.h.mu.Unlock()
		req := idem.Request{Scope: "history", Key: key, Operation: "POST /v1/transfers",
			Fingerprint: idem.Fingerprint([]byte(key), []byte(payload))}
		body := fmt.Sprintf("%s/%s/client-%d/op-%d", key, payload, id, n)
		cut := db != r.e.db && rng.IntN(5) == 0
		if cut {
			r.proxy.arm([]int32{loseCommit, loseCommitReply}[rng.IntN(2)])
		}
		if rng.IntN(2) == 0 {
			r.do(db, rng, req, payload, body, cut)
		} else {
			r.begin(db, rng, req, payload, body, cut)
		}
		if cut {
			r.proxy.arm(passCommit)
		}
	}
}

// do runs one Do, killing its own session inside fn one time in ten.
func (r *historyRun) do(db pool, rng *rand.Rand, req idem.Request, payload, body string, cut bool) {
	kill := rng.IntN(10) == 0 && !r.e.embedded()
	killed := false
	var res idem.Result
	err := runTx(ctx, db, nil, func(tx txn) error {
		var (
			id  int64
			err error
		)
		if kill {
			if id, err = r.e.sessionID(tx); err != nil {
				return err
			}
		}
		res, err = r.s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			r.h.claim(req.Key, payload)
			if kill {
				killed = true
				r.h.count(r.h.faults, "session killed")
				if err := r.e.killSession(id); err != nil {
					return idem.Response{}, err
				}
			}
			if err := r.e.insertRow(tx, r.biz, req.Key, body); err != nil {
				return idem.Response{}, err
			}
			return idem.Response{StatusCode: 201, Body: []byte(body)}, nil
		})
		return err
	})
	if err == nil && !res.Replayed && string(res.Body) != body {
		err = fmt.Errorf("Do returned %q for its own execution %q", res.Body, body)
	}
	r.outcome(req, payload, body, err, &res, cut || killed)
}

// begin runs Begin and, with a claim, one of: crash (abandon it), Release,
// or Complete in a business transaction, sometimes after outliving the
// lease, sometimes after Extend, sometimes killed before Complete.
func (r *historyRun) begin(db pool, rng *rand.Rand, req idem.Request, payload, body string, cut bool) {
	c, replay, err := r.s.Begin(ctx, db, req)
	if err != nil || replay != nil {
		if err != nil && cut {
			r.h.claim(req.Key, payload) // the claim may have committed
		}
		r.outcome(req, payload, body, err, replay, cut)
		return
	}
	r.h.claim(req.Key, payload)
	switch x := rng.IntN(20); {
	case x < 2:
		r.h.count(r.h.faults, "crash after Begin")
		r.h.count(r.h.outcomes, "claim abandoned")
	case x < 4:
		err := c.Release(ctx, db)
		if errors.Is(err, idem.ErrLeaseLost) {
			r.h.count(r.h.outcomes, "lease lost")
			return
		}
		if err == nil {
			r.h.count(r.h.outcomes, "released")
			return
		}
		r.outcome(req, payload, body, err, nil, cut)
	default:
		if x < 7 {
			r.h.count(r.h.faults, "lease outlived")
			time.Sleep(historyLease + 50*time.Millisecond)
		}
		if x%2 == 0 {
			if err := c.Extend(ctx, db, historyLease); err != nil {
				if !errors.Is(err, idem.ErrLeaseLost) {
					r.outcome(req, payload, body, err, nil, cut)
					return
				}
			}
		}
		kill := x == 19 && !r.e.embedded()
		killed := kill
		err := runTx(ctx, db, nil, func(tx txn) error {
			if err := r.e.insertRow(tx, r.biz, req.Key, body); err != nil {
				return err
			}
			if kill {
				kill = false
				r.h.count(r.h.faults, "session killed")
				id, err := r.e.sessionID(tx)
				if err != nil {
					return err
				}
				if err := r.e.killSession(id); err != nil {
					return err
				}
			}
			return c.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte(body)})
		})
		r.outcome(req, payload, body, err, &idem.Result{Response: idem.Response{Body: []byte(body)}}, cut || killed)
	}
}

// outcome records what a client saw. res is the result when err is nil:
// a replay, or the client's own execution.
func (r *historyRun) outcome(req idem.Request, payload, body string, err error, res *idem.Result, fault bool) {
	h := r.h
	switch {
	case err == nil && res.Replayed:
		h.add(h.replays, req.Key, string(res.Body))
		h.count(h.outcomes, "replayed")
	case err == nil:
		h.add(h.successes, req.Key, body)
		h.count(h.outcomes, "executed")
	case errors.Is(err, idem.ErrMismatch):
		h.add(h.mismatches, req.Key, payload)
		h.count(h.outcomes, "mismatch")
	case errors.Is(err, idem.ErrInFlight):
		h.count(h.outcomes, "in flight")
	case errors.Is(err, idem.ErrLeaseLost):
		h.count(h.outcomes, "lease lost")
	case fault:
		h.count(h.outcomes, "failed by a fault")
	case idem.IsRetryable(err):
		h.count(h.outcomes, "gave up retrying")
	default:
		h.mu.Lock()
		h.unexpected = append(h.unexpected, fmt.Errorf("key %s payload %s: %w", req.Key, payload, err))
		h.mu.Unlock()
	}
}

// check verifies the invariants per key and returns how many observations
// it checked.
func (r *historyRun) check(t *testing.T) int {
	checked := 0
	for key := range r.h.keys {
		o := r.e.committed(t, r.s, r.biz, key)
		completed, status, stored := o.completed(), o.status, o.stored
		if completed {
			payload := strings.Split(string(stored), "/")[1]
			if o.fingerprint != idem.Fingerprint([]byte(key), []byte(payload)) {
				t.Errorf("%s: stored result %q under another payload's fingerprint", key, stored)
			}
		}
		for _, b := range r.h.successes[key] {
			checked++
			if !completed || b != string(stored) {
				t.Errorf("%s: a client saw %q commit, but the record is %q with %q", key, b, status, stored)
			}
		}
		for _, b := range r.h.replays[key] {
			checked++
			if !completed || b != string(stored) {
				t.Errorf("%s: replayed %q, but the record is %q with %q", key, b, status, stored)
			}
		}
		for _, p := range r.h.mismatches[key] {
			checked++
			other := false
			for q := range r.h.claimed[key] {
				other = other || q != p
			}
			if !other {
				t.Errorf("%s: ErrMismatch for payload %s, but no claim ever had another payload", key, p)
			}
		}
	}
	return checked
}
