package idem

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idem/internal/driver"
)

// This file is the engine's entrance for the native driver packages of
// this module (idempgx): the same claim algorithm, statements and
// Observer as the methods of Store and Claim, run over their driver.Conn
// and driver.TxRunner instead of database/sql. The handles' nil checks
// are theirs.

func init() { driver.Engine = native{} }

// native is the engine as driver.Engine holds it. Its methods are
// exported so that a driver package can declare their signatures; its type
// is not, so they are no part of package idem's API.
type native struct{}

func (native) Do(ctx context.Context, s *Store, tx driver.Conn, req Request, fn func(ctx context.Context) (Response, error)) (Result, error) {
	return s.do(ctx, nativeConn{tx}, req, fn)
}

func (native) Begin(ctx context.Context, s *Store, inTx driver.TxRunner, req Request) (*Claim, *Result, error) {
	return s.begin(ctx, nativeTx(inTx), req)
}

func (native) Extend(ctx context.Context, c *Claim, db driver.Conn, d time.Duration) error {
	return c.extend(ctx, nativeConn{db}, d)
}

func (native) Complete(ctx context.Context, c *Claim, tx driver.Conn, resp Response) error {
	return c.complete(ctx, nativeConn{tx}, resp)
}

func (native) Release(ctx context.Context, c *Claim, db driver.Conn) error {
	return c.release(ctx, nativeConn{db})
}

func (native) Migrate(ctx context.Context, s *Store, db driver.Conn) error {
	return s.migrate(ctx, nativeConn{db})
}

func (native) Purge(ctx context.Context, s *Store, inTx driver.TxRunner, batch int) (int64, error) {
	return s.purge(ctx, nativeTx(inTx), batch)
}

func (native) PurgeBatch(ctx context.Context, s *Store, inTx driver.TxRunner, limit int) (int64, error) {
	return s.purgeOne(ctx, nativeTx(inTx), limit)
}

func (native) Inspect(ctx context.Context, s *Store, db driver.Conn, scope, key string) (*Record, error) {
	return s.inspect(ctx, nativeConn{db}, scope, key)
}

func (native) Stats(ctx context.Context, s *Store, db driver.Conn) (Stats, error) {
	return s.stats(ctx, nativeConn{db})
}

// nativeConn adapts a native driver's driver.Conn to conn.
type nativeConn struct{ c driver.Conn }

func (n nativeConn) exec(ctx context.Context, q query) (int64, error) { return n.c.Exec(ctx, q) }

func (n nativeConn) queryRow(ctx context.Context, q query, dest ...any) error {
	return n.c.QueryRow(ctx, q, dest...)
}

func (n nativeConn) queryRows(ctx context.Context, q query, each func(scan func(dest ...any) error) error) error {
	return n.c.QueryRows(ctx, q, each)
}

// nativeTx adapts a native driver's driver.TxRunner to txRunner.
func nativeTx(inTx driver.TxRunner) txRunner {
	return func(ctx context.Context, iso sql.IsolationLevel, fn func(c conn) error) error {
		return inTx(ctx, iso, func(c driver.Conn) error { return fn(nativeConn{c}) })
	}
}
