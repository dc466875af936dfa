package idem

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/driver"
)

// This file is the engine's door for the native driver packages
// (idempgx): the same claim algorithm, statements and Observer as the
// methods of Store and Claim, over their own driver.Conn and
// driver.TxRunner instead of database/sql's (sqlconn.go). Package
// internal/engine declares the door once, as the interface
// engine.Engine, and hands it to the driver packages; the handles' nil
// checks are theirs.

func init() { driver.Engine = native{} }

// native is the engine as driver.Engine holds it, an engine.Engine. Its
// methods are exported so that they satisfy that interface; its type is
// not, so they are no part of package idem's API.
type native struct{}

func (native) SQL(s *Store, db driver.ExecQuerier) driver.Conn { return newSQLConn(db, s.dialect) }

func (native) ClaimSQL(c *Claim, db driver.ExecQuerier) driver.Conn {
	return newSQLConn(db, c.s.dialect)
}

func (native) Do(ctx context.Context, s *Store, tx driver.Conn, req Request, fn func(ctx context.Context) (Response, error)) (Result, error) {
	return s.do(ctx, tx, req, fn)
}

func (native) Begin(ctx context.Context, s *Store, inTx driver.TxRunner, req Request) (*Claim, *Result, error) {
	return s.begin(ctx, inTx, req)
}

func (native) Extend(ctx context.Context, c *Claim, db driver.Conn, d time.Duration) error {
	return c.extend(ctx, db, d)
}

func (native) Complete(ctx context.Context, c *Claim, tx driver.Conn, resp Response) error {
	return c.complete(ctx, tx, resp)
}

func (native) Release(ctx context.Context, c *Claim, db driver.Conn) error {
	return c.release(ctx, db)
}

func (native) Migrate(ctx context.Context, s *Store, db driver.Conn) error {
	return s.migrate(ctx, db)
}

func (native) Purge(ctx context.Context, s *Store, inTx driver.TxRunner, batch int) (int64, error) {
	return s.purge(ctx, inTx, batch)
}

func (native) PurgeBatch(ctx context.Context, s *Store, inTx driver.TxRunner, limit int) (int64, error) {
	return s.purgeBatch(ctx, inTx, limit)
}

func (native) Inspect(ctx context.Context, s *Store, db driver.Conn, scope, key string) (*Record, error) {
	return s.inspect(ctx, db, scope, key)
}

func (native) InspectKey(ctx context.Context, s *Store, db driver.Conn, key string, limit int) ([]Record, error) {
	return s.inspectKey(ctx, db, key, limit)
}

func (native) Stats(ctx context.Context, s *Store, db driver.Conn) (Stats, error) {
	return s.stats(ctx, db)
}
