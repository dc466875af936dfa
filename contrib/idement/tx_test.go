package idement_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idement"
	"github.com/idemkit/idem/contrib/idement/internal/ent"
	"github.com/idemkit/idem/internal/stacktest"
)

// ent's client runs each statement on its own: with sql/execquery it has
// ExecContext and QueryContext, but neither QueryRowContext (so it is no
// idem.DBTX) nor Commit and Rollback (so it is no idement.Tx). Neither
// compiles where a transaction is wanted. ent's *Tx is an idement.Tx,
// and no idem.DBTX (it has no QueryRowContext): it goes through idement.
func TestOnlyTransactionsCompile(t *testing.T) {
	dbtx, entTx := reflect.TypeFor[idem.DBTX](), reflect.TypeFor[idement.Tx]()
	client, tx := reflect.TypeFor[*ent.Client](), reflect.TypeFor[*ent.Tx]()
	for _, m := range []string{"ExecContext", "QueryContext"} {
		if _, ok := client.MethodByName(m); !ok {
			t.Fatalf("*ent.Client has no %s: was it generated without --feature sql/execquery?", m)
		}
	}
	if client.Implements(dbtx) || client.Implements(entTx) {
		t.Errorf("*ent.Client, a pool, satisfies idem.DBTX (%v) or idement.Tx (%v)", client.Implements(dbtx), client.Implements(entTx))
	}
	if !tx.Implements(entTx) || tx.Implements(dbtx) {
		t.Errorf("*ent.Tx: idement.Tx %v (want true), idem.DBTX %v (want false)", tx.Implements(entTx), tx.Implements(dbtx))
	}
}

// Complete stores a claim's result through ent's transaction, and a
// second Complete of the same claim changes nothing and is told why
// (ErrLeaseLost), read through QueryContext. A nil transaction, Store or
// Claim is an error before any statement.
func TestComplete(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, _ string, store *idem.Store) {
		ctx := t.Context()
		req := stacktest.ORMCharge("claimed", "100")
		c, _, err := store.Begin(ctx, db, req)
		if err != nil {
			t.Fatal(err)
		}
		complete := func() error {
			return idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
				if _, err := tx.Charge.Create().SetRef(req.Key).SetAmount(100).Save(ctx); err != nil {
					return err
				}
				return idement.Complete(ctx, c, tx, idem.Response{StatusCode: 201, Body: []byte("charged")})
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

		var nilTx *ent.Tx
		for _, tx := range []idement.Tx{nil, nilTx} {
			if _, err := idement.Do(ctx, store, tx, req, ok); err == nil || !strings.Contains(err.Error(), "got nil") {
				t.Errorf("Do on a nil %T: %v, want an error", tx, err)
			}
			if err := idement.Complete(ctx, c, tx, idem.Response{StatusCode: 201}); err == nil || !strings.Contains(err.Error(), "got nil") {
				t.Errorf("Complete on a nil %T: %v, want an error", tx, err)
			}
		}
		if _, err := idement.Do(ctx, nil, nilTx, req, ok); err == nil {
			t.Error("Do with a nil Store: no error")
		}
		if err := idement.Complete(ctx, nil, nilTx, idem.Response{StatusCode: 201}); err == nil {
			t.Error("Complete on a nil Claim: no error")
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
