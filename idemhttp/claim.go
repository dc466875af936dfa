package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httpdriver"
)

// serveClaim runs the handler under a claim committed by Begin, and
// completes the claim in the handler's transaction.
func (m *Middleware) serveClaim(next http.Handler, w http.ResponseWriter, r *http.Request, req *idem.Request, body []byte) {
	ctx := r.Context() // with a key: not cancelled by the client, bounded by Timeout
	var claim httpdriver.Claim
	if req != nil {
		c, replay, err := m.drv.Begin(ctx, *req)
		switch {
		case err != nil:
			m.answerError(w, r, err)
			return
		case replay != nil:
			m.replay(w, *replay)
			return
		}
		claim = c
		ctx = httpdriver.WithClaim(ctx, claim)
	}
	// Once the handler has run, its effects are recorded even if it used
	// up Timeout: the transaction and the release do not end with the
	// handler's context.
	detached := context.WithoutCancel(ctx)
	h := httpdriver.Lazy(m.drv, func() (httpdriver.Tx, error) { return m.drv.BeginTx(detached) })
	finished := false
	defer func() {
		if !finished { // the handler panicked: clean up and let the panic go on
			m.abandon(detached, h, claim)
		}
	}()
	rec := m.run(next, r.WithContext(ctx), h, body)
	finished = true
	if err := m.complete(detached, h, claim, rec); err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			h.Rollback(detached) // the claim is no longer this request's to release
		} else {
			m.abandon(detached, h, claim)
		}
		m.answerError(w, r, err)
		return
	}
	writeResponse(w, rec.header, rec.statusCode(), rec.body.Bytes())
}

// complete stores the handler's answer with the claim in the handler's
// transaction (begun now if the handler never asked for it) and commits.
func (m *Middleware) complete(ctx context.Context, h *httpdriver.Holder, claim httpdriver.Claim, rec *recorder) error {
	resp, err := m.result(rec)
	if err != nil {
		return err
	}
	tx, err := h.Tx()
	if err != nil {
		return fmt.Errorf("idemhttp: begin the handler's transaction: %w", err)
	}
	if claim != nil {
		if err := claim.Complete(ctx, tx, resp); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// abandon rolls back the handler's transaction, if it began, and releases
// the claim, so that the client's retry runs at once.
func (m *Middleware) abandon(ctx context.Context, h *httpdriver.Holder, claim httpdriver.Claim) {
	h.Rollback(ctx)
	if claim == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := claim.Release(ctx); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		m.cfg.Logger.WarnContext(ctx, "idemhttp: release the claim; it is held until its lease ends", "err", err)
	}
}
