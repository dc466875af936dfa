package idemhttp

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// TxFrom returns the transaction the handler writes its rows through, or
// nil outside the middleware and for a method it passes through. The
// handler must not commit or roll it back: the middleware does. Pass the
// request's context (r.Context(); under gin, c.Request.Context(), or
// idemgin.TxFrom(c)).
//
// In [idemserve.ModeTransaction] the transaction is open before the handler runs. In
// [idemserve.ModeClaim] the first call of TxFrom begins it, so call it only once the
// slow work is done. TxFrom returns nil if it could not begin; the
// middleware then rolls back and answers 500 in place of any 2xx, 3xx or
// 4xx the handler writes (a 5xx of the handler's own is passed on).
//
// Behind a middleware on another driver's Runner ([Config].Runner), TxFrom
// returns nil and begins nothing: the handler's transaction is that
// driver's (idempgx.TxFrom for pgx).
func TxFrom(ctx context.Context) *sql.Tx { return idemserve.SQLTxFrom(ctx) }

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the middleware is running the handler for; ok is false when
// the request carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) { return idemserve.RequestFrom(ctx) }

// ClaimFrom returns the claim the middleware holds for the request whose
// context is ctx: in [idemserve.ModeClaim], for a request with a key. Otherwise it
// returns nil. The handler uses its RelayKey, and may extend it for work
// longer than the Store's lease (Extend on the *sql.DB, ExtendOn on
// another driver's pool); the middleware completes or releases it.
func ClaimFrom(ctx context.Context) *idem.Claim { return idemserve.ClaimFrom(ctx) }
