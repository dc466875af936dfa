package conformance

import (
	"context"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
)

// The TestHTTP tests run on every target: the middleware runs its
// transactions on the target's driver (Config.DB where the target's DB is
// SQL's, Config.Runner of the DB's Runner on any other), and the handlers
// reach their transaction through TxFrom and their claim through
// idemhttp.ClaimFrom, as the suite's txn and claim, so that a test reads
// the same on both.

// middleware is idemhttp's middleware on db, a pool of e's target,
// through its driver; cfg.DB and cfg.Runner are unset, and cfg.TxOptions
// are given to the Runner of a DB that is not SQL's.
func (e *env) middleware(db pool, cfg idemhttp.Config) (*idemhttp.Middleware, error) {
	if p, ok := db.(*runnerPool); ok {
		cfg.Runner = unwrapping(p.runner(cfg.TxOptions))
		cfg.TxOptions = nil
		return idemhttp.New(cfg)
	}
	cfg.DB = sqlDBOf(db)
	return idemhttp.New(cfg)
}

// txFrom is the transaction of a handler behind e's middleware, or nil:
// idemhttp.TxFrom's *sql.Tx, or the Runner's idem.Tx (idemserve.TxFrom,
// through unwrapping).
func (e *env) txFrom(ctx context.Context) txn {
	if tx, ok := idemserve.TxFrom[idem.Tx](ctx); ok {
		return runnerTxn(tx)
	}
	if tx := idemhttp.TxFrom(ctx); tx != nil {
		return sqlTxn(tx)
	}
	return nil
}

// claimFrom is the claim of a handler behind e's middleware in
// ModeClaim, or nil.
func (e *env) claimFrom(ctx context.Context) *claim {
	if c := idemhttp.ClaimFrom(ctx); c != nil {
		_, onSQL := e.db.(*sqlPool)
		return &claim{Claim: c, onSQL: onSQL}
	}
	return nil
}

// unwrapping is r with the method idemserve.TxFrom[idem.Tx] looks for,
// which hands a handler the transaction r began, as the driver's own
// TxFrom (idempgx.TxFrom) hands it the driver's; a Pipeliner stays one.
func unwrapping(r idem.Runner) idem.Runner {
	if p, ok := r.(idem.Pipeliner); ok {
		return unwrappingPipeliner{p}
	}
	return unwrappingRunner{r}
}

type unwrappingRunner struct{ idem.Runner }

func (unwrappingRunner) Unwrap(tx idem.Tx) idem.Tx { return tx }

type unwrappingPipeliner struct{ idem.Pipeliner }

func (unwrappingPipeliner) Unwrap(tx idem.Tx) idem.Tx { return tx }

// smallPool opens a pool of at most conns connections on e's target,
// closed when the test ends (after the servers it serves, which the test
// starts later).
func (e *env) smallPool(conns int) pool {
	e.t.Helper()
	p, err := e.connect(e.dsn, conns)
	must(e.t, err)
	e.t.Cleanup(p.close)
	return p
}

// closedPool is a pool of e's target that is closed: any use fails.
func (e *env) closedPool() pool {
	e.t.Helper()
	p, err := e.connect(e.dsn, 1)
	must(e.t, err)
	p.close()
	return p
}
