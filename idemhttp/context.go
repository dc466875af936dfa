package idemhttp

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httpdriver"
)

type ctxKey int

const requestKey ctxKey = iota

// TxFrom returns the transaction the handler writes its rows through, or
// nil outside the middleware and for a method it passes through. The
// handler must not commit or roll it back: the middleware does.
//
// In [ModeTransaction] the transaction is open before the handler runs. In
// [ModeClaim] the first call of TxFrom begins it, so call it only once the
// slow work is done. TxFrom returns nil if it could not begin; the
// middleware then rolls back and answers 500 in place of any 2xx, 3xx or
// 4xx the handler writes (a 5xx of the handler's own is passed on).
//
// Behind the middleware of idempgx.Middleware, which runs on pgx, TxFrom
// returns nil and begins nothing: the handler's pgx.Tx is
// idempgx.TxFrom's.
func TxFrom(ctx context.Context) *sql.Tx {
	tx, ok := httpdriver.TxFrom[*sqlDriver, sqlTx](ctx)
	if !ok {
		return nil
	}
	return tx.Tx
}

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the middleware is running the handler for; ok is false when
// the request carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) {
	req, ok = ctx.Value(requestKey).(idem.Request)
	return req, ok
}

// ClaimFrom returns the claim the middleware holds for the request whose
// context is ctx: in [ModeClaim], for a request with a key. Otherwise it
// returns nil, and so it does behind idempgx.Middleware, whose claim is
// idempgx.ClaimFrom's. The handler uses its RelayKey, and may Extend it
// for work longer than the Store's lease; the middleware completes or
// releases it.
func ClaimFrom(ctx context.Context) *idem.Claim {
	c, _ := httpdriver.ClaimFrom(ctx).(*sqlClaim)
	if c == nil {
		return nil
	}
	return c.c
}
