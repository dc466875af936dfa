package main

import (
	"context"
	crand "crypto/rand"
	"errors"
	"maps"
	"math/rand/v2"
	"sync"
	"time"
)

// CardProvider charges cards. It is idempotent by key, as real providers
// are: a second call with a key it has seen returns the first call's
// result and charges nothing.
type CardProvider interface {
	Charge(ctx context.Context, key string, c Charge) (ProviderResult, error)
}

// Charge is what is asked of the provider.
type Charge struct {
	Amount   int64
	Currency string
	Card     string
}

// ProviderResult is the provider's answer to a charge.
type ProviderResult struct {
	Ref      string // the provider's id of the charge
	Declined bool
	Reason   string // why it was declined
}

// ErrProviderUnavailable is a failure of the provider that charged nothing:
// the charge may be tried again with the same key.
var ErrProviderUnavailable = errors.New("card provider unavailable")

// DeclinedCard is a test card the fake provider always declines.
const DeclinedCard = "4000000000000002"

// FakeProvider is an in-memory CardProvider. It can be told to be slow
// and to fail a fraction of calls before charging. It is safe for
// concurrent use.
type FakeProvider struct {
	mu       sync.Mutex
	delay    time.Duration
	failRate float64
	results  map[string]ProviderResult
	calls    map[string]int
}

// NewFakeProvider returns a provider that is fast and never fails.
func NewFakeProvider() *FakeProvider {
	return &FakeProvider{results: map[string]ProviderResult{}, calls: map[string]int{}}
}

// Charge implements CardProvider.
func (p *FakeProvider) Charge(ctx context.Context, key string, c Charge) (ProviderResult, error) {
	p.mu.Lock()
	p.calls[key]++
	delay, failRate := p.delay, p.failRate
	p.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return ProviderResult{}, ctx.Err()
	}
	if rand.Float64() < failRate {
		return ProviderResult{}, ErrProviderUnavailable
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.results[key]; ok {
		return r, nil
	}
	r := ProviderResult{Ref: "pr_" + crand.Text()[:16]}
	if c.Card == DeclinedCard {
		r = ProviderResult{Ref: r.Ref, Declined: true, Reason: "card_declined"}
	}
	p.results[key] = r
	return r, nil
}

// SetDelay makes every later call take d.
func (p *FakeProvider) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// SetFailRate makes a fraction f (0..1) of later calls fail with
// ErrProviderUnavailable, charging nothing.
func (p *FakeProvider) SetFailRate(f float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failRate = f
}

// Calls returns how many calls the provider received, by key.
func (p *FakeProvider) Calls() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.calls)
}

// Charges returns how many distinct charges the provider made.
func (p *FakeProvider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.results)
}
