package idemgrpc

import (
	"context"
	"database/sql"
	"sync"

	"github.com/idemkit/idem"
)

type ctxKey int

const (
	txKey ctxKey = iota
	requestKey
	claimKey
)

// TxFrom returns the transaction the handler writes its rows through, or
// nil outside the interceptor and for a method that passes through. The
// handler must not commit or roll it back: the interceptor does.
//
// In [ModeTransaction] the transaction is open before the handler runs. In
// [ModeClaim] the first call of TxFrom begins it, so call it only once the
// slow work is done. TxFrom returns nil if it could not begin; the
// interceptor then rolls back and answers INTERNAL in place of the
// handler's answer.
func TxFrom(ctx context.Context) *sql.Tx {
	h, _ := ctx.Value(txKey).(*txHolder)
	if h == nil {
		return nil
	}
	return h.get()
}

// RequestFrom returns the [idem.Request] (scope, key, operation,
// fingerprint) the interceptor is running the handler for; ok is false
// when the call carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) {
	req, ok = ctx.Value(requestKey).(idem.Request)
	return req, ok
}

// ClaimFrom returns the claim the interceptor holds for the call whose
// context is ctx: in [ModeClaim], for a call with a key. Otherwise it
// returns nil. The handler uses its RelayKey, and may Extend it for work
// longer than the Store's lease; the interceptor completes or releases it.
func ClaimFrom(ctx context.Context) *idem.Claim {
	c, _ := ctx.Value(claimKey).(*idem.Claim)
	return c
}

// txHolder is a call's transaction: open from the start in
// ModeTransaction, begun by the first call of TxFrom in ModeClaim.
type txHolder struct {
	mu    sync.Mutex
	tx    *sql.Tx
	begin func() (*sql.Tx, error) // ModeClaim: nil once called
	err   error                   // from begin
}

func (h *txHolder) get() *sql.Tx {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.begin != nil {
		h.tx, h.err = h.begin()
		h.begin = nil
	}
	return h.tx
}

// rollback rolls the transaction back if it began, and keeps it from
// beginning later.
func (h *txHolder) rollback() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.begin = nil
	if h.tx != nil {
		_ = h.tx.Rollback()
	}
}
