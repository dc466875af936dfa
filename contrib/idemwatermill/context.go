package idemwatermill

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// TxFrom returns the transaction the handler whose context is ctx
// (msg.Context()) writes its rows through, or nil outside the
// middleware. The handler must not commit or roll it back: the
// middleware does, and the router acks the message only after the
// commit.
//
// In [idemserve.ModeTransaction] the transaction is open before the
// handler runs. In [idemserve.ModeClaim] the first call of TxFrom begins
// it, so call it only once the slow work is done. TxFrom returns nil if
// it could not begin; the middleware then rolls back, releases the claim
// and returns an error, so that the message is nacked.
//
// Behind a middleware on another driver's Runner ([Config].Runner),
// TxFrom returns nil and begins nothing: the handler's transaction is
// that driver's (idempgx.TxFrom(msg.Context()) for pgx).
func TxFrom(ctx context.Context) *sql.Tx { return idemserve.SQLTxFrom(ctx) }

// ClaimFrom returns the claim the middleware holds for the message whose
// context is ctx (msg.Context()) in [idemserve.ModeClaim], or nil. The
// handler passes its RelayKey to the external service it calls as that
// service's idempotency key, so that a redelivery after a crash does not
// repeat the call's effect, and may extend it for work longer than the
// Store's lease (Extend on the *sql.DB, ExtendOn on another driver's
// pool); the middleware completes or releases it.
func ClaimFrom(ctx context.Context) *idem.Claim { return idemserve.ClaimFrom(ctx) }

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the middleware is running the handler for; ok is false
// outside the middleware.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) { return idemserve.RequestFrom(ctx) }
