// Package httpdriver is the seam between idemhttp's serving logic and the
// database drivers it runs on, as package driver is the seam between
// idem's engine and them. idemhttp serves every request (the key, the
// body, the scope, the gate, the transaction and Do, the claim and its
// lazy transaction, the problems and the replays) over a [Driver]; its
// database/sql Driver is in idemhttp itself, pgx's is in idempgx, which
// builds its middleware through [NewMiddleware]. A handler reaches its
// transaction and claim through the context, with the TxFrom and
// ClaimFrom of its driver's package, which read what is stored here.
package httpdriver

import (
	"context"
	"sync"

	"github.com/idemkit/idem"
)

// Driver runs the middleware's database work on one driver's pool, with
// the middleware's Store and transaction options.
type Driver interface {
	// RunTx runs fn in a transaction begun with the middleware's
	// options and commits it, running it again on an error for which
	// idem.IsRetryable is true, as idem.RunTx does.
	RunTx(ctx context.Context, fn func(tx Tx) error) error
	// Do is idem.Store.Do in tx, a transaction of RunTx.
	Do(ctx context.Context, tx Tx, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error)
	// Begin is idem.Store.Begin on the pool: exactly one of the claim,
	// the replay and the error is non-nil.
	Begin(ctx context.Context, req idem.Request) (Claim, *idem.Result, error)
	// BeginTx begins a transaction with the middleware's options: the
	// handler's, in ModeClaim.
	BeginTx(ctx context.Context) (Tx, error)
}

// Tx is an open transaction of a Driver; the driver's package gets its
// own handle (a *sql.Tx, a pgx.Tx) back from it.
type Tx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Claim is a claim of Driver.Begin.
type Claim interface {
	// Complete is idem.Claim.Complete in tx, a transaction of the same
	// Driver.
	Complete(ctx context.Context, tx Tx, resp idem.Response) error
	// Release is idem.Claim.Release on the pool.
	Release(ctx context.Context) error
}

// NewMiddleware is set by idemhttp when it starts: it checks cfg, an
// idemhttp.Config whose DB and TxOptions are unset, and returns the
// *idemhttp.Middleware that runs on d, as idemhttp.New does on a *sql.DB.
// A driver's package asserts the result to *idemhttp.Middleware: it
// imports idemhttp, so idemhttp's init has run by then.
var NewMiddleware func(cfg any, d Driver) (any, error)

// Holder is a request's transaction: open from the start in
// ModeTransaction, begun by the handler's first call of TxFrom in
// ModeClaim.
type Holder struct {
	driver Driver
	mu     sync.Mutex
	tx     Tx
	begin  func() (Tx, error) // ModeClaim: nil once called
	err    error              // from begin
}

// Open is the Holder of tx, a transaction of d that is already open.
func Open(d Driver, tx Tx) *Holder { return &Holder{driver: d, tx: tx} }

// Lazy is a Holder whose transaction, of d, begin begins on the first
// call of Tx.
func Lazy(d Driver, begin func() (Tx, error)) *Holder { return &Holder{driver: d, begin: begin} }

// Tx returns the transaction, beginning it on the first call of a Lazy
// Holder, or why it could not begin (then the Tx is nil), or nil and nil
// once Rollback kept it from beginning.
func (h *Holder) Tx() (Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.begin != nil {
		h.tx, h.err = h.begin()
		h.begin = nil
	}
	return h.tx, h.err
}

// Rollback rolls the transaction back if it began, and keeps it from
// beginning later.
func (h *Holder) Rollback(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.begin = nil
	if h.tx != nil {
		_ = h.tx.Rollback(ctx)
	}
}

type (
	holderKey struct{}
	claimKey  struct{}
)

// WithHolder returns ctx carrying h, for the handler's TxFrom.
func WithHolder(ctx context.Context, h *Holder) context.Context {
	return context.WithValue(ctx, holderKey{}, h)
}

// HolderFrom returns the Holder ctx carries, or nil.
func HolderFrom(ctx context.Context) *Holder {
	h, _ := ctx.Value(holderKey{}).(*Holder)
	return h
}

// TxFrom is a driver package's TxFrom: the transaction of the Holder ctx
// carries, begun now if it is lazy, as T, the transaction type of the
// driver D. ok is false outside the middleware, behind the middleware of
// another driver (whose transaction it does not begin), and when the
// transaction could not begin.
func TxFrom[D Driver, T Tx](ctx context.Context) (tx T, ok bool) {
	h := HolderFrom(ctx)
	if h == nil {
		return tx, false
	}
	if _, mine := h.driver.(D); !mine {
		return tx, false
	}
	t, _ := h.Tx()
	tx, ok = t.(T)
	return tx, ok
}

// WithClaim returns ctx carrying c, for the handler's ClaimFrom.
func WithClaim(ctx context.Context, c Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// ClaimFrom returns the Claim ctx carries, or nil; the driver's package
// asserts it to its own type.
func ClaimFrom(ctx context.Context) Claim {
	c, _ := ctx.Value(claimKey{}).(Claim)
	return c
}
