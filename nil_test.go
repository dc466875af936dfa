package idem_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
)

// wrappedTx is a caller's own type around *sql.Tx, as DBTX's doc allows
// (and as *sqlx.Tx is: the conformance suite refuses a nil one too).
type wrappedTx struct{ *sql.Tx }

// wrappedPgxTx is a caller's own type around pgx.Tx.
type wrappedPgxTx struct{ pgx.Tx }

// A nil handle of any type is refused, before any statement, with the
// message an untyped nil gets: never a panic. The claim's record is
// untouched by the refused calls.
func TestNilHandles(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:nilhandles?mode=memory&cache=shared")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithTable("nil_keys"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	req := idem.Request{Scope: "s", Key: "k", Operation: "op", Fingerprint: "f"}
	claim, _, err := store.Begin(ctx, db, req)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	fn := func(context.Context) (idem.Response, error) { ran = true; return idem.Response{StatusCode: 200}, nil }
	txs := map[string]idem.DBTX{
		"untyped nil":   nil,
		"nil *sql.Tx":   (*sql.Tx)(nil),
		"nil wrapper":   (*wrappedTx)(nil),
		"nil *sql.DB":   (*sql.DB)(nil),
		"nil *sql.Conn": (*sql.Conn)(nil),
	}
	check := func(call string, err error, want string) {
		t.Helper()
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", call, err, want)
		}
	}
	for name, tx := range txs {
		t.Run(name, func(t *testing.T) {
			check("Do", func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("Do panicked: %v", p)
					}
				}()
				_, err = store.Do(ctx, tx, req, fn)
				return err
			}(), "idem: Do needs an open transaction, got nil")
			check("Apply", noPanic(t, func() error {
				_, err := store.Apply(ctx, tx, req, idem.Response{StatusCode: 200}, func(context.Context) error { return nil })
				return err
			}), "idem: Apply needs an open transaction, got nil")
			check("Complete", noPanic(t, func() error { return claim.Complete(ctx, tx, idem.Response{StatusCode: 200}) }),
				"idem: Complete needs an open transaction, got nil")
			check("Extend", noPanic(t, func() error { return claim.Extend(ctx, tx, 0) }), "idem: Extend needs a database handle, got nil")
			check("Release", noPanic(t, func() error { return claim.Release(ctx, tx) }), "idem: Release needs a database handle, got nil")
			check("Migrate", noPanic(t, func() error { return store.Migrate(ctx, tx) }), "idem: Migrate needs a database handle, got nil")
			check("Inspect", noPanic(t, func() error { _, err := store.Inspect(ctx, tx, "s", "k"); return err }),
				"idem: Inspect needs a database handle, got nil")
			check("Stats", noPanic(t, func() error { _, err := store.Stats(ctx, tx); return err }), "idem: Stats needs a database handle, got nil")
		})
	}
	for name, tx := range map[string]pgx.Tx{"untyped nil": nil, "nil wrapper": (*wrappedPgxTx)(nil)} {
		t.Run("pgx "+name, func(t *testing.T) {
			check("DoOn", noPanic(t, func() error { _, err := store.DoOn(ctx, idempgx.Tx(tx), req, fn); return err }),
				"idem: Do needs an open transaction, got nil")
			check("CompleteOn", noPanic(t, func() error { return claim.CompleteOn(ctx, idempgx.Tx(tx), idem.Response{StatusCode: 200}) }),
				"idem: Complete needs a database handle, got nil")
			check("ExtendOn", noPanic(t, func() error { return claim.ExtendOn(ctx, idempgx.Conn(tx), 0) }), "idem: Extend needs a database handle, got nil")
			check("ReleaseOn", noPanic(t, func() error { return claim.ReleaseOn(ctx, idempgx.Conn(tx)) }), "idem: Release needs a database handle, got nil")
		})
	}
	check("BeginOn", noPanic(t, func() error { _, _, err := store.BeginOn(ctx, (*idem.SQLRunner)(nil), req); return err }),
		"idem: Begin needs a pool, got nil")
	if ran {
		t.Error("fn ran")
	}
	rec, err := store.Inspect(ctx, db, req.Scope, req.Key)
	if err != nil || rec == nil || rec.Status != idem.StatusProcessing || rec.Token != claim.Token() {
		t.Errorf("after the refused calls: %+v, %v; want the claim still processing", rec, err)
	}
}

// noPanic runs f and reports a panic as a test error.
func noPanic(t *testing.T, f func() error) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("panicked: %v", p)
		}
	}()
	return f()
}
