package idempgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/httpdriver"
)

// Middleware is [idemhttp.New] for a pgx service: the same middleware,
// which runs its transactions on pool, each begun with opts (as [RunTx]
// begins them), and hands the handler its pgx.Tx through [TxFrom] and, in
// [idemhttp.ModeClaim], its claim through [ClaimFrom]. cfg is as for
// idemhttp.New, with DB and TxOptions left unset (they are database/sql's;
// opts takes TxOptions' place); its Store, an *idem.Store for
// [idem.Postgres], is run over pgx as [New] runs it, so it may serve the
// database/sql side of the service too. Everything else (the key, the
// fingerprint, the modes, the gate, the problems, the replays) is
// idemhttp's, and its documentation holds.
func Middleware(pool *pgxpool.Pool, opts pgx.TxOptions, cfg idemhttp.Config) (*idemhttp.Middleware, error) {
	switch {
	case pool == nil:
		return nil, errors.New("idempgx: Middleware needs a *pgxpool.Pool, got nil")
	case cfg.DB != nil || cfg.TxOptions != nil:
		return nil, errors.New("idempgx: Middleware runs on its *pgxpool.Pool: leave Config.DB and Config.TxOptions unset, and pass pgx.TxOptions to Middleware (or build a database/sql middleware with idemhttp.New)")
	case cfg.Store == nil:
		return nil, errors.New("idempgx: Middleware needs Config.Store, an *idem.Store for idem.Postgres that records the keys")
	case cfg.Store.Dialect() != idem.Postgres:
		return nil, fmt.Errorf("idempgx: Middleware needs Config.Store for idem.Postgres, got one for %s", cfg.Store.Dialect().Name())
	}
	s, err := New(cfg.Store)
	if err != nil {
		return nil, err
	}
	m, err := httpdriver.NewMiddleware(cfg, &httpDriver{store: s, pool: pool, opts: opts})
	if err != nil {
		return nil, err
	}
	return m.(*idemhttp.Middleware), nil
}

// TxFrom returns the pgx transaction the handler writes its rows through,
// behind the middleware of [Middleware], or nil outside it, for a method
// it passes through and behind a database/sql middleware (whose
// transaction is [idemhttp.TxFrom]'s). The handler must not commit or roll
// it back: the middleware does.
//
// In [idemhttp.ModeTransaction] the transaction is open before the handler
// runs. In [idemhttp.ModeClaim] the first call of TxFrom begins it, so
// call it only once the slow work is done; it returns nil if it could not
// begin, and the middleware then rolls back and answers 500 in place of
// any 2xx, 3xx or 4xx the handler writes.
func TxFrom(ctx context.Context) pgx.Tx {
	tx, _ := httpdriver.TxFrom[*httpDriver, pgx.Tx](ctx)
	return tx
}

// ClaimFrom returns the claim the middleware of [Middleware] holds for the
// request whose context is ctx: in [idemhttp.ModeClaim], for a request
// with a key. Otherwise it returns nil. The handler passes its RelayKey to
// the provider, and may Extend it on the pool for work longer than the
// Store's lease; the middleware completes or releases it.
func ClaimFrom(ctx context.Context) *Claim {
	c, _ := httpdriver.ClaimFrom(ctx).(*httpClaim)
	if c == nil {
		return nil
	}
	return c.c
}

// httpDriver runs idemhttp's middleware on a pool.
type httpDriver struct {
	store *Store
	pool  *pgxpool.Pool
	opts  pgx.TxOptions
}

func (d *httpDriver) RunTx(ctx context.Context, fn func(tx httpdriver.Tx) error) error {
	return RunTx(ctx, d.pool, d.opts, func(tx pgx.Tx) error { return fn(tx) })
}

func (d *httpDriver) Do(ctx context.Context, tx httpdriver.Tx, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	return d.store.Do(ctx, tx.(pgx.Tx), req, fn)
}

func (d *httpDriver) Begin(ctx context.Context, req idem.Request) (httpdriver.Claim, *idem.Result, error) {
	c, replay, err := d.store.Begin(ctx, d.pool, req)
	if c == nil {
		return nil, replay, err
	}
	return &httpClaim{c: c, pool: d.pool}, nil, nil
}

func (d *httpDriver) BeginTx(ctx context.Context) (httpdriver.Tx, error) {
	tx, err := d.pool.BeginTx(ctx, d.opts)
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// httpClaim is a claim of the middleware's, released on its pool.
type httpClaim struct {
	c    *Claim
	pool *pgxpool.Pool
}

func (c *httpClaim) Complete(ctx context.Context, tx httpdriver.Tx, resp idem.Response) error {
	return c.c.Complete(ctx, tx.(pgx.Tx), resp)
}

func (c *httpClaim) Release(ctx context.Context) error { return c.c.Release(ctx, c.pool) }
