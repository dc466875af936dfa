package idement_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idement"
	"github.com/idemkit/idem/contrib/idement/internal/ent"
	"github.com/idemkit/idem/idemtest"
)

// ent's client runs each statement on its own: with sql/execquery it has
// ExecContext and QueryContext, so it is an idem.DBTX, but no Commit and
// Rollback, and Do and Complete refuse it before any statement, saying
// what to pass. ent's *Tx is an idem.DBTX with them, and an idement.Tx.
func TestOnlyTransactionsAccepted(t *testing.T) {
	dbtx, entTx := reflect.TypeFor[idem.DBTX](), reflect.TypeFor[idement.Tx]()
	client, tx := reflect.TypeFor[*ent.Client](), reflect.TypeFor[*ent.Tx]()
	if !client.Implements(dbtx) {
		t.Fatal("*ent.Client is no idem.DBTX: was it generated without --feature sql/execquery?")
	}
	if client.Implements(entTx) || !tx.Implements(entTx) || !tx.Implements(dbtx) {
		t.Errorf("*ent.Client is an idement.Tx: %v (want false); *ent.Tx is one: %v, and an idem.DBTX: %v (want true, true)",
			client.Implements(entTx), tx.Implements(entTx), tx.Implements(dbtx))
	}
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, _ string, store *idem.Store) {
		ctx := t.Context()
		req := idemtest.ChargeRequest("client", "100")
		if _, err := store.Do(ctx, client, req, ok); err == nil || !strings.Contains(err.Error(), "needs an open transaction") {
			t.Errorf("Do on *ent.Client: %v, want a refusal that asks for an open transaction", err)
		}
		c, _, err := store.Begin(ctx, db, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Complete(ctx, client, idem.Response{StatusCode: 201}); err == nil || !strings.Contains(err.Error(), "needs an open transaction") {
			t.Errorf("Complete on *ent.Client: %v, want a refusal that asks for an open transaction", err)
		}
		if rec, err := store.Inspect(ctx, db, req.Scope, req.Key); err != nil || rec == nil || rec.Status != idem.StatusProcessing {
			t.Errorf("after the refused calls: record %+v (%v), want the claim still processing", rec, err)
		}
	})
}

// Complete stores a claim's result through ent's transaction, and a
// second Complete of the same claim changes nothing and is told why
// (ErrLeaseLost), read through QueryContext.
func TestComplete(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, _ string, store *idem.Store) {
		ctx := t.Context()
		req := idemtest.ChargeRequest("claimed", "100")
		c, _, err := store.Begin(ctx, db, req)
		if err != nil {
			t.Fatal(err)
		}
		complete := func() error {
			return idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
				if _, err := tx.Charge.Create().SetRef(req.Key).SetAmount(100).Save(ctx); err != nil {
					return err
				}
				return c.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte("charged")})
			})
		}
		if err := complete(); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if err := complete(); !errors.Is(err, idem.ErrLeaseLost) || !strings.Contains(err.Error(), "already completed") {
			t.Fatalf("Complete again: %v, want ErrLeaseLost saying it was already completed", err)
		}
		if n, err := rows(client)(ctx, req.Key); err != nil || n != 1 {
			t.Fatalf("%d charges (%v), want 1: the second Complete's row rolled back", n, err)
		}
		rec, err := store.Inspect(ctx, db, req.Scope, req.Key)
		if err != nil || rec == nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "charged" {
			t.Fatalf("record %+v (%v), want it completed with the response", rec, err)
		}
	})
}

// RunTx commits what fn wrote; fn's error rolls it back and is returned
// as it is, without a retry; a panic rolls back and goes on.
func TestRunTx(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, _ string, store *idem.Store) {
		ctx := t.Context()
		count := rows(client)
		write := func(ref string) func(tx *ent.Tx) error {
			return func(tx *ent.Tx) error { return tx.Charge.Create().SetRef(ref).SetAmount(1).Exec(ctx) }
		}
		if err := idement.RunTx(ctx, client.BeginTx, nil, write("committed")); err != nil {
			t.Fatal(err)
		}
		errFn := errors.New("fn failed")
		attempts := 0
		err := idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
			attempts++
			if err := write("failed")(tx); err != nil {
				return err
			}
			return errFn
		})
		if !errors.Is(err, errFn) || attempts != 1 {
			t.Fatalf("RunTx whose fn fails: %v after %d attempts, want fn's error after 1", err, attempts)
		}
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("recovered %v, want the panic passed on", p)
				}
			}()
			_ = idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
				_ = write("panicked")(tx)
				panic("boom")
			})
		}()
		for ref, want := range map[string]int{"committed": 1, "failed": 0, "panicked": 0} {
			if n, err := count(ctx, ref); err != nil || n != want {
				t.Errorf("%d charges %q (%v), want %d", n, ref, err, want)
			}
		}
		if err := idement.RunTx[*ent.Tx](ctx, nil, nil, write("x")); err == nil {
			t.Error("RunTx without begin: no error")
		}
	})
}

func ok(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil }

// A nil *ent.Tx is refused, before any statement, with the message an
// untyped nil gets, by Do, Complete, Extend and Release: never a panic.
func TestNilTx(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, _ *ent.Client, _ string, store *idem.Store) {
		ctx := t.Context()
		var tx *ent.Tx
		req := idemtest.ChargeRequest("nil", "100")
		c, _, err := store.Begin(ctx, db, req)
		if err != nil {
			t.Fatal(err)
		}
		for call, f := range map[string]func() error{
			"Do": func() error {
				_, err := store.Do(ctx, tx, req, func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil })
				return err
			},
			"Complete": func() error { return c.Complete(ctx, tx, idem.Response{StatusCode: 201}) },
			"Extend":   func() error { return c.Extend(ctx, tx, time.Minute) },
			"Release":  func() error { return c.Release(ctx, tx) },
		} {
			want := "idem: " + call + " needs an open transaction, got nil"
			if call == "Extend" || call == "Release" {
				want = "idem: " + call + " needs a database handle, got nil"
			}
			if err := refused(f); err == nil || err.Error() != want {
				t.Errorf("%s with a nil *ent.Tx: %v, want %q", call, err, want)
			}
		}
		if rec, err := store.Inspect(ctx, db, req.Scope, req.Key); err != nil || rec == nil || rec.Status != idem.StatusProcessing {
			t.Errorf("after the refused calls: record %+v (%v), want the claim still processing", rec, err)
		}
	})
}

// refused runs f and turns a panic into an error that says so.
func refused(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	return f()
}
