package idemgrpc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/idemkit/idem"
)

// serveClaim runs the handler under a claim committed by Begin, and
// completes the claim in the handler's transaction.
func (i *Interceptor) serveClaim(ctx, work context.Context, req any, method string, r *idem.Request, handler grpc.UnaryHandler) (any, error) {
	var claim *idem.Claim
	if r != nil {
		c, replay, err := i.cfg.Store.Begin(work, i.cfg.DB, *r)
		switch {
		case err != nil:
			return nil, i.answerError(ctx, method, r.Key, err)
		case replay != nil:
			return i.replay(ctx, replay.Response, method, r.Key)
		}
		claim = c
		work = context.WithValue(work, claimKey, claim)
	}
	// Once the handler has run, its effects are recorded even if it used
	// up Timeout: the transaction and the release do not end with the
	// handler's context.
	detached := context.WithoutCancel(work)
	h := &txHolder{begin: func() (*sql.Tx, error) { return i.cfg.DB.BeginTx(detached, i.cfg.TxOptions) }}
	finished := false
	defer func() {
		if !finished { // the handler panicked: clean up and let the panic go on
			i.abandon(detached, h, claim)
		}
	}()
	a := i.run(work, req, method, handler, h)
	finished = true
	if err := i.complete(detached, h, claim, a); err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			h.rollback() // the claim is no longer this call's to release
		} else {
			i.abandon(detached, h, claim)
		}
		return nil, i.answerError(ctx, method, keyIn(r), err)
	}
	return a.send(ctx, false)
}

// complete stores the handler's answer with the claim in the handler's
// transaction (begun now if the handler never asked for it) and commits.
func (i *Interceptor) complete(ctx context.Context, h *txHolder, claim *idem.Claim, a *answer) error {
	if !i.isResult(a.status.Code()) {
		return &attemptError{answer: a}
	}
	tx := h.get()
	if h.err != nil {
		return fmt.Errorf("idemgrpc: begin the handler's transaction: %w", h.err)
	}
	if claim != nil {
		resp, err := a.response(i.keep)
		if err != nil {
			return err
		}
		if err := claim.Complete(ctx, tx, resp); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// abandon rolls back the handler's transaction, if it began, and releases
// the claim, so that the client's retry runs at once.
func (i *Interceptor) abandon(ctx context.Context, h *txHolder, claim *idem.Claim) {
	h.rollback()
	if claim == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := claim.Release(ctx, i.cfg.DB); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		i.cfg.Logger.WarnContext(ctx, "idemgrpc: release the claim; it is held until its lease ends", "err", err)
	}
}
