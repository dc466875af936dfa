// Package engine is the one door through which a driver package of this
// repository (idempgx; contrib/idement) runs package idem's engine over
// its own connections: the claim algorithm, statements and Observer of
// Store and Claim, on an [driver.Conn] or a [driver.TxRunner] of the
// driver's instead of database/sql's. Package idem implements [Engine]
// (its native.go) and hands it over through driver.Engine when it starts;
// this package imports idem, so that has happened by the time [E] is set.
//
// A new operation of Store or Claim that a driver package should offer is
// a method of idem's native type and one line here.
package engine

import (
	"context"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/driver"
)

// Engine runs each operation of a Store or a Claim over a driver's
// handles, as the method of the same name does over database/sql.
type Engine interface {
	// SQL is the Conn through which database/sql's methods run s's
	// statements on db, as its dialect has them sent: for a driver
	// package whose handle has database/sql's ExecContext and
	// QueryContext but is no idem.DBTX (ent's Tx).
	SQL(s *idem.Store, db driver.ExecQuerier) driver.Conn
	// ClaimSQL is SQL for the Store of c.
	ClaimSQL(c *idem.Claim, db driver.ExecQuerier) driver.Conn
	Do(ctx context.Context, s *idem.Store, tx driver.Conn, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error)
	Begin(ctx context.Context, s *idem.Store, inTx driver.TxRunner, req idem.Request) (*idem.Claim, *idem.Result, error)
	Extend(ctx context.Context, c *idem.Claim, db driver.Conn, d time.Duration) error
	Complete(ctx context.Context, c *idem.Claim, tx driver.Conn, resp idem.Response) error
	Release(ctx context.Context, c *idem.Claim, db driver.Conn) error
	Migrate(ctx context.Context, s *idem.Store, db driver.Conn) error
	Purge(ctx context.Context, s *idem.Store, inTx driver.TxRunner, batch int) (int64, error)
	PurgeBatch(ctx context.Context, s *idem.Store, inTx driver.TxRunner, limit int) (int64, error)
	Inspect(ctx context.Context, s *idem.Store, db driver.Conn, scope, key string) (*idem.Record, error)
	InspectKey(ctx context.Context, s *idem.Store, db driver.Conn, key string, limit int) ([]idem.Record, error)
	Stats(ctx context.Context, s *idem.Store, db driver.Conn) (idem.Stats, error)
}

// E is package idem's engine.
var E = driver.Engine.(Engine)
