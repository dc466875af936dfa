package idembun_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/uptrace/bun"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// A *bun.DB and a bun.Conn run each statement on their own, and format
// it themselves, passing the driver no arguments. Do and Complete refuse
// them before any statement, saying what to pass; before they did, a
// *bun.DB was accepted: on MariaDB its claim committed at once, apart
// from the business rows, and on PostgreSQL the claim failed for want of
// its $1. Inside db.RunInTx, the bun.Tx (or a *bun.Tx) is accepted, and
// idem runs on the *sql.Tx it holds.
func TestOnlyTransactionsAccepted(t *testing.T) {
	eachStack(t, func(t *testing.T, db *bun.DB, store *idem.Store) {
		ctx := t.Context()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		claimed := idemtest.ChargeRequest("claimed", "100")
		c, _, err := store.Begin(ctx, db.DB, claimed)
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]idem.DBTX{"*bun.DB": db, "bun.Conn": conn} {
			refused := func(what string, err error) {
				t.Helper()
				for _, want := range []string{"needs an open transaction", "got " + name, "it can begin transactions", "inside db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { ... }), pass tx"} {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("%s on %s: err = %v, want a refusal that says %q", what, name, err, want)
					}
				}
			}
			req := idemtest.ChargeRequest("outside", "100")
			ran, seen := false, false
			_, err := store.Do(ctx, h, req, func(ctx context.Context) (idem.Response, error) {
				ran = true
				rec, err := store.Inspect(ctx, db.DB, req.Scope, req.Key)
				seen = err == nil && rec != nil
				return idem.Response{StatusCode: 201}, nil
			})
			refused("Do", err)
			if ran {
				t.Errorf("Do on %s ran fn (and another connection saw the claim committed while it ran: %v)", name, seen)
			}
			if rec, err := store.Inspect(ctx, db.DB, req.Scope, req.Key); err != nil || rec != nil {
				t.Errorf("after Do on %s: record %+v (%v), want none", name, rec, err)
			}
			refused("Complete", c.Complete(ctx, h, idem.Response{StatusCode: 201}))
		}
		if rec, err := store.Inspect(ctx, db.DB, claimed.Scope, claimed.Key); err != nil || rec == nil || rec.Status != idem.StatusProcessing {
			t.Errorf("after the refused Completes: record %+v (%v), want the claim still processing", rec, err)
		}

		inTx := idemtest.ChargeRequest("in-tx", "100")
		err = db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			if _, err := store.Do(ctx, &tx, inTx, ok); err != nil {
				return fmt.Errorf("Do on a *bun.Tx: %w", err)
			}
			if err := c.Complete(ctx, tx, idem.Response{StatusCode: 201}); err != nil {
				return fmt.Errorf("Complete on a bun.Tx: %w", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []idem.Request{inTx, claimed} {
			if rec, err := store.Inspect(ctx, db.DB, r.Scope, r.Key); err != nil || rec == nil || rec.Status != idem.StatusCompleted {
				t.Errorf("after RunInTx: record %+v (%v), want it completed", rec, err)
			}
		}
	})
}

func ok(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil }

// A savepoint's bun.Tx (tx.RunInTx inside a transaction) is the same
// transaction: what Do writes through it rolls back with the savepoint,
// and the key runs again after it.
func TestSavepoint(t *testing.T) {
	eachStack(t, func(t *testing.T, db *bun.DB, store *idem.Store) {
		ctx := t.Context()
		req := idemtest.ChargeRequest("savepoint", "100")
		errUndo := errors.New("undo the savepoint")
		var res idem.Result
		err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			err := tx.RunInTx(ctx, nil, func(ctx context.Context, sp bun.Tx) error {
				if _, err := store.Do(ctx, sp, req, ok); err != nil {
					return err
				}
				return errUndo
			})
			if !errors.Is(err, errUndo) {
				return fmt.Errorf("the savepoint: %w", err)
			}
			res, err = store.Do(ctx, tx, req, ok)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Replayed {
			t.Error("the Do after the savepoint replayed: the savepoint's record outlived its rollback")
		}
		rec, err := store.Inspect(ctx, db.DB, req.Scope, req.Key)
		if err != nil || rec == nil || rec.Status != idem.StatusCompleted {
			t.Fatalf("record %+v (%v), want it completed once, by the Do after the savepoint", rec, err)
		}
	})
}
