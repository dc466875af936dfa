// The claim scenarios' helpers: a payment provider that honours its own
// idempotency key, and a worker that claims with Begin, takes over after
// a lease or completes.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// demoLease is the lease of the claim scenarios: short, so that the demo
// waits little for it to end.
const demoLease = 500 * time.Millisecond

// callProvider is a payment provider that honours its own idempotency key,
// as real ones do: a second call with one key charges nothing.
func (d *demo) callProvider(ctx context.Context, providerKey, key string) error {
	query := "INSERT INTO " + d.provider + " (provider_key, idem_key, amount) VALUES (?, ?, 1000) ON CONFLICT (provider_key) DO NOTHING"
	if d.t.Dialect == idem.MySQL || d.t.Dialect == idem.MariaDB || d.t.Dialect == idem.TiDB {
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
			return nil, errors.New("the first Begin replayed a response nobody stored")
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
