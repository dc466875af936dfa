package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
)

// fault is what the proxy does to one connection.
type fault int

const (
	pass  fault = iota // forward both ways
	delay              // wait up to 30ms, then forward both ways
	reset              // reset the client's connection before forwarding anything
	drop               // forward the request, then reset the client's connection once the server has answered
	cut                // forward the request, then reset both connections within 20ms, answered or not
	nFaults
)

var faultNames = [nFaults]string{"pass", "delay", "reset", "drop", "cut"}

// faultDeck is one round of faults; the proxy deals them in a random order,
// so every 20 connections see each fault, and 9 of them reach no answer.
var faultDeck = []fault{
	pass, pass, pass, pass, pass, pass, pass, pass,
	delay, delay, delay,
	reset, reset, reset,
	drop, drop, drop,
	cut, cut, cut,
}

// faultProxy is a TCP proxy on a loopback port that hurts the connections
// through it.
type faultProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	rng    *rand.Rand
	deck   []fault
	counts [nFaults]int
}

// newFaultProxy starts a proxy to target, which stops when the test ends.
func newFaultProxy(t *testing.T, target string, seed uint64) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, 0))}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f, wait := p.deal()
			p.wg.Go(func() { p.handle(c.(*net.TCPConn), f, wait) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

// deal returns the next fault and a random wait to go with it.
func (p *faultProxy) deal() (fault, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.deck) == 0 {
		p.deck = append(p.deck, faultDeck...)
		p.rng.Shuffle(len(p.deck), func(i, j int) { p.deck[i], p.deck[j] = p.deck[j], p.deck[i] })
	}
	f := p.deck[0]
	p.deck = p.deck[1:]
	p.counts[f]++
	return f, time.Duration(p.rng.Int64N(int64(30 * time.Millisecond)))
}

func (p *faultProxy) handle(c *net.TCPConn, f fault, wait time.Duration) {
	deadline := time.Now().Add(10 * time.Second)
	c.SetDeadline(deadline)
	if f == reset {
		c.SetLinger(0)
		c.Close()
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	s.SetDeadline(deadline)
	if f == delay {
		time.Sleep(wait)
	}
	forwarded := make(chan struct{})
	var up sync.WaitGroup
	up.Go(func() {
		buf := make([]byte, 32<<10)
		once := sync.OnceFunc(func() { close(forwarded) })
		defer once()
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
				once()
			}
			if err != nil {
				return
			}
		}
	})
	switch f {
	case pass, delay:
		io.Copy(c, s) // the server closes after its answer: no keep-alive
	case drop:
		s.Read(make([]byte, 1)) // the first byte of the answer: the server is done
		c.SetLinger(0)
	case cut:
		<-forwarded
		time.Sleep(wait * 2 / 3)
		c.SetLinger(0)
	}
	c.Close()
	s.Close()
	up.Wait()
}

// count returns how many connections got fault f.
func (p *faultProxy) count(f fault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[f]
}

// statusCounter is a RoundTripper that counts the answers of base by
// status, and the errors, of every attempt.
type statusCounter struct {
	base   http.RoundTripper
	mu     sync.Mutex
	counts map[string]int
}

func (c *statusCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	what := "error"
	if err == nil {
		what = fmt.Sprint(resp.StatusCode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[what]++
	return resp, err
}

// TestClientThroughFaults sends payments through idemclient.Transport and
// a proxy that resets connections, delays them and drops answers after the
// server has committed: every client must get its charge, and the table
// must hold exactly one row per payment.
func TestClientThroughFaults(t *testing.T) {
	provider := NewFakeProvider()
	// Slow enough that a retry after a cut can find the first attempt
	// still running: a 409 with Retry-After.
	provider.SetDelay(20 * time.Millisecond)
	testClientThroughFaults(t, start(t, dsn(t), provider), provider)
}

// outcome is what one client got for its payment.
type outcome struct {
	amount   int64
	status   int
	charge   chargeJSON
	key      string
	replayed bool
	err      error
}

func testClientThroughFaults(t *testing.T, svc service, provider *FakeProvider) {
	seed := rand.Uint64()
	t.Logf("proxy seed %d", seed)
	proxy := newFaultProxy(t, strings.TrimPrefix(svc.url, "http://"), seed)
	// One connection, so one fault, per attempt.
	attempts := &statusCounter{base: &http.Transport{DisableKeepAlives: true}, counts: map[string]int{}}
	client := &http.Client{Transport: &idemclient.Transport{
		Base:          attempts,
		MaxAttempts:   15,
		MaxElapsed:    15 * time.Second,
		BaseDelay:     5 * time.Millisecond,
		MaxDelay:      100 * time.Millisecond,
		MaxRetryAfter: 100 * time.Millisecond,
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()

	const payments = 30
	outcomes := make([]outcome, payments)
	var wg sync.WaitGroup
	for i := range outcomes {
		o := &outcomes[i]
		o.amount = int64(1000 + i)
		wg.Go(func() {
			body := fmt.Sprintf(`{"amount": %d, "currency": "EUR", "card": "4242424242424242"}`, o.amount)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy.ln.Addr().String()+"/v1/charges", strings.NewReader(body))
			if err != nil {
				o.err = err
				return
			}
			req.Header.Set("Authorization", "Bearer "+apiKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				o.err = err
				return
			}
			defer resp.Body.Close()
			o.status, o.key, o.replayed = resp.StatusCode, idemclient.Key(resp), resp.Header.Get("Idempotent-Replayed") == "true"
			if err := json.NewDecoder(resp.Body).Decode(&o.charge); err != nil {
				o.err = fmt.Errorf("payment of %d: %d: %w", o.amount, o.status, err)
			}
		})
	}
	wg.Wait()

	var errs []error
	ids, keys := map[string]int64{}, map[string]bool{}
	replays := 0
	for _, o := range outcomes {
		switch {
		case o.err != nil:
			errs = append(errs, o.err)
		case o.status != http.StatusCreated || o.charge.Amount != o.amount || o.charge.Status != "succeeded" || o.key == "":
			errs = append(errs, fmt.Errorf("payment of %d: %d %+v with key %q", o.amount, o.status, o.charge, o.key))
		default:
			ids[o.charge.ID], keys[o.key] = o.amount, true
			if o.replayed {
				replays++
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(ids) != payments || len(keys) != payments {
		t.Fatalf("%d payments got %d distinct charges and %d distinct keys", payments, len(ids), len(keys))
	}

	rows, err := svc.db.Query("SELECT id, amount FROM " + svc.charges)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	stored := map[string]int64{}
	for rows.Next() {
		var id string
		var amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatal(err)
		}
		if _, dup := stored[id]; dup {
			t.Fatalf("charge %s stored twice", id)
		}
		stored[id] = amount
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stored) != payments {
		t.Fatalf("the charges table holds %d rows for %d payments", len(stored), payments)
	}
	for id, amount := range ids {
		if stored[id] != amount {
			t.Fatalf("charge %s of %d: the table holds %d", id, amount, stored[id])
		}
	}
	if n := provider.Charges(); n != payments {
		t.Fatalf("the provider made %d charges for %d payments", n, payments)
	}

	var seen []string
	for f := range nFaults {
		seen = append(seen, fmt.Sprintf("%s %d", faultNames[f], proxy.count(f)))
		if proxy.count(f) == 0 {
			t.Errorf("no connection got fault %s", faultNames[f])
		}
	}
	attempts.mu.Lock()
	t.Logf("connections: %s; attempts: %v; replayed answers: %d", strings.Join(seen, ", "), attempts.counts, replays)
	attempts.mu.Unlock()
	if replays == 0 {
		t.Errorf("no client got a replay, though %d answers were dropped after the server committed", proxy.count(drop))
	}
}
