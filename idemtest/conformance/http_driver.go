package conformance

import (
	"context"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
)

// The TestHTTP tests run on every target: the middleware runs its
// transactions on the target's driver (Config.DB on a database/sql
// target, Config.Runner of idempgx.New on a native one), and the
// handlers reach their transaction through that driver's TxFrom and
// their claim through idemhttp.ClaimFrom, as the suite's txn and claim,
// so that a test reads the same on both.

// middleware is idemhttp's middleware on db, a pool of e's target,
// through its driver; cfg.DB and cfg.Runner are unset, and cfg.TxOptions
// are given to a native target's Runner in pgx's terms.
func (e *env) middleware(db pool, cfg idemhttp.Config) (*idemhttp.Middleware, error) {
	if p, ok := db.(*pgxPool); ok {
		cfg.Runner = idempgx.New(p.db, pgxOptions(cfg.TxOptions))
		cfg.TxOptions = nil
		return idemhttp.New(cfg)
	}
	cfg.DB = sqlDBOf(db)
	return idemhttp.New(cfg)
}

// txFrom is the transaction of a handler behind e's middleware, or nil.
func (e *env) txFrom(ctx context.Context) txn {
	if e.native {
		if tx := idempgx.TxFrom(ctx); tx != nil {
			return pgxTxn(tx)
		}
		return nil
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
		return &claim{Claim: c, native: e.native}
	}
	return nil
}

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

// poolWaits is how many times a request for one of db's connections
// waited for another to be released. A *pgxpool.Pool counts the acquires
// that found no idle connection, whether they waited for a release or
// opened a new one, and counts the new ones: the difference is the waits.
func poolWaits(db pool) int64 {
	if p, ok := db.(*pgxPool); ok {
		st := p.db.Stat()
		return st.EmptyAcquireCount() - st.NewConnsCount()
	}
	return sqlDBOf(db).Stats().WaitCount
}
