package idemhttp

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/driver"
	"github.com/idemkit/idem/internal/httpdriver"
)

// sqlDriver runs the middleware on database/sql: Config.DB, with
// Config.TxOptions. idempgx has the one for pgx.
type sqlDriver struct {
	store *idem.Store
	db    *sql.DB
	opts  *sql.TxOptions
}

func (d *sqlDriver) RunTx(ctx context.Context, fn func(tx httpdriver.Tx) error) error {
	return idem.RunTx(ctx, d.db, d.opts, func(tx *sql.Tx) error { return fn(sqlTx{Tx: tx}) })
}

func (d *sqlDriver) Do(ctx context.Context, tx httpdriver.Tx, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	return d.store.Do(ctx, tx.(sqlTx).Tx, req, fn)
}

func (d *sqlDriver) Begin(ctx context.Context, req idem.Request) (httpdriver.Claim, *idem.Result, error) {
	c, replay, err := d.store.Begin(ctx, d.db, req)
	if c == nil {
		return nil, replay, err
	}
	return &sqlClaim{c: c, db: d.db}, nil, nil
}

func (d *sqlDriver) BeginTx(ctx context.Context) (httpdriver.Tx, error) {
	tx, err := d.db.BeginTx(ctx, d.opts)
	if err != nil {
		return nil, err
	}
	return sqlTx{Tx: tx}, nil
}

// sqlTx is a *sql.Tx; it ends on the context it began with.
type sqlTx = driver.NoContext[*sql.Tx]

// sqlClaim is an *idem.Claim, released on the pool it was begun on.
type sqlClaim struct {
	c  *idem.Claim
	db *sql.DB
}

func (c *sqlClaim) Complete(ctx context.Context, tx httpdriver.Tx, resp idem.Response) error {
	return c.c.Complete(ctx, tx.(sqlTx).Tx, resp)
}

func (c *sqlClaim) Release(ctx context.Context) error { return c.c.Release(ctx, c.db) }
