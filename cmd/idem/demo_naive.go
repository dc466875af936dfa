// The naive design the demo measures idem against: a response cache
// looked up before the charge and filled after it, each statement
// committing on its own.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

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
