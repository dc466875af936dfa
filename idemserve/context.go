package idemserve

import (
	"context"
	"database/sql"
	"sync"

	"github.com/idemkit/idem"
)

type (
	holderKey  struct{}
	claimKey   struct{}
	requestKey struct{}
)

// holder is a call's transaction: open from the start in ModeTransaction,
// begun by the handler's first TxFrom in ModeClaim.
type holder struct {
	runner idem.Runner
	mu     sync.Mutex
	tx     idem.Tx
	begin  func() (idem.Tx, error) // ModeClaim: nil once called
	err    error                   // from begin
}

// get returns the transaction, beginning it on the first call in
// ModeClaim, or why it could not begin (then the Tx is nil), or nil and
// nil once rollback kept it from beginning.
func (h *holder) get() (idem.Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.begin != nil {
		h.tx, h.err = h.begin()
		h.begin = nil
	}
	return h.tx, h.err
}

// rollback rolls the transaction back if it began, and keeps it from
// beginning later.
func (h *holder) rollback(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.begin = nil
	if h.tx != nil {
		_ = h.tx.Rollback(ctx)
	}
}

func withHolder(ctx context.Context, h *holder) context.Context {
	return context.WithValue(ctx, holderKey{}, h)
}

// TxFrom returns the transaction of the call whose context is ctx as T,
// the transaction type of the Runner's driver (*sql.Tx, pgx.Tx), for the
// TxFrom of that driver's package: idemhttp.TxFrom is TxFrom[*sql.Tx],
// idempgx.TxFrom is TxFrom[pgx.Tx]. The Runner unwraps it, through its
// method Unwrap(idem.Tx) T. In ModeClaim the first call begins the
// transaction. ok is false outside a Server's call, when the Runner's
// transactions are not T's (TxFrom then begins nothing), and when the
// transaction could not begin.
func TxFrom[T any](ctx context.Context) (tx T, ok bool) {
	h, _ := ctx.Value(holderKey{}).(*holder)
	if h == nil {
		return tx, false
	}
	u, mine := h.runner.(interface{ Unwrap(idem.Tx) T })
	if !mine {
		return tx, false
	}
	t, err := h.get()
	if err != nil || t == nil {
		return tx, false
	}
	return u.Unwrap(t), true
}

// SQLTxFrom is TxFrom for database/sql: the *sql.Tx of the call whose
// context is ctx, behind a Server on a DB (or on an [idem.SQLRunner]),
// or nil.
func SQLTxFrom(ctx context.Context) *sql.Tx {
	tx, _ := TxFrom[*sql.Tx](ctx)
	return tx
}

// ClaimFrom returns the claim the Server holds for the call whose context
// is ctx: in ModeClaim, for a call with a key. Otherwise it returns nil.
// The handler passes its RelayKey to the provider, and may extend it for
// work longer than the Store's lease; the Server completes or releases
// it.
func ClaimFrom(ctx context.Context) *idem.Claim {
	c, _ := ctx.Value(claimKey{}).(*idem.Claim)
	return c
}

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the Server is running the handler for; ok is false when
// the call carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) {
	req, ok = ctx.Value(requestKey{}).(idem.Request)
	return req, ok
}
