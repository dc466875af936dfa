package idemgorm_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// Outside a transaction, GORM's db.Statement.ConnPool is its pool: a
// *sql.DB, or with PrepareStmt a *gorm.PreparedStmtDB, whose BeginTx
// returns an interface. Do and Complete refuse either before any
// statement, saying what to pass; before they did, the prepared pool was
// accepted and the claim committed at once, apart from the business rows
// (fn saw it from another connection). Inside db.Transaction, its
// *sql.Tx or *gorm.PreparedStmtTX is accepted. A *gorm.DB is no DBTX at
// all: it has none of its methods.
func TestOnlyTransactionsAccepted(t *testing.T) {
	if reflect.TypeFor[*gorm.DB]().Implements(reflect.TypeFor[idem.DBTX]()) {
		t.Fatal("*gorm.DB satisfies idem.DBTX: pass tx.Statement.ConnPool, or it would compile")
	}
	eachDB(t, func(t *testing.T, db *gorm.DB, store *idem.Store) {
		ctx := t.Context()
		pool := db.Statement.ConnPool
		wantPool, wantTx, hint := "*sql.DB", "*sql.Tx", "docs/orm.md"
		if db.PrepareStmt {
			wantPool, wantTx, hint = "*gorm.PreparedStmtDB", "*gorm.PreparedStmtTX", "inside db.Transaction(func(tx *gorm.DB) error { ... }), pass tx.Statement.ConnPool"
		}
		if got := fmt.Sprintf("%T", pool); got != wantPool {
			t.Fatalf("db.Statement.ConnPool is %s, want %s", got, wantPool)
		}
		refused := func(what string, err error) {
			t.Helper()
			for _, want := range []string{"needs an open transaction", "got " + wantPool, "it can begin transactions", hint} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s on %s: err = %v, want a refusal that says %q", what, wantPool, err, want)
				}
			}
		}

		req := idemtest.ChargeRequest("on-the-pool", "100")
		ran, seen := false, false
		_, err := store.Do(ctx, pool, req, func(ctx context.Context) (idem.Response, error) {
			ran = true
			rec, err := store.Inspect(ctx, sqlDB(t, db), req.Scope, req.Key)
			seen = err == nil && rec != nil
			return idem.Response{StatusCode: 201}, nil
		})
		refused("Do", err)
		if ran {
			t.Errorf("Do on %s ran fn (and another connection saw the claim committed while it ran: %v)", wantPool, seen)
		}
		if rec, err := store.Inspect(ctx, sqlDB(t, db), req.Scope, req.Key); err != nil || rec != nil {
			t.Errorf("after Do on %s: record %+v (%v), want none", wantPool, rec, err)
		}

		claimed := idemtest.ChargeRequest("claimed", "100")
		c, _, err := store.Begin(ctx, sqlDB(t, db), claimed)
		if err != nil {
			t.Fatal(err)
		}
		refused("Complete", c.Complete(ctx, pool, idem.Response{StatusCode: 201}))
		if rec, err := store.Inspect(ctx, sqlDB(t, db), claimed.Scope, claimed.Key); err != nil || rec == nil || rec.Status != idem.StatusProcessing {
			t.Errorf("after Complete on %s: record %+v (%v), want the claim still processing", wantPool, rec, err)
		}

		err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if got := fmt.Sprintf("%T", tx.Statement.ConnPool); got != wantTx {
				t.Errorf("inside Transaction, tx.Statement.ConnPool is %s, want %s", got, wantTx)
			}
			if _, err := store.Do(ctx, tx.Statement.ConnPool, req, ok); err != nil {
				return fmt.Errorf("Do on %s: %w", wantTx, err)
			}
			if err := c.Complete(ctx, tx.Statement.ConnPool, idem.Response{StatusCode: 201}); err != nil {
				return fmt.Errorf("Complete on %s: %w", wantTx, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []idem.Request{req, claimed} {
			if rec, err := store.Inspect(ctx, sqlDB(t, db), r.Scope, r.Key); err != nil || rec == nil || rec.Status != idem.StatusCompleted {
				t.Errorf("after the transaction: record %+v (%v), want it completed", rec, err)
			}
		}
	})
}

func ok(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil }

// With PrepareStmt, GORM prepares and caches every statement text run
// through its *gorm.PreparedStmtTX (by default for a day, without a bound); idem's
// statements through it would add the MySQL dialect's texts (their
// arguments written in) for every key, and cost a prepare each on either
// server. Do runs them on the transaction's *sql.Tx instead, so GORM's
// cache holds none of them.
func TestPreparedStmtCacheHoldsNoIdemStatement(t *testing.T) {
	eachDB(t, func(t *testing.T, db *gorm.DB, store *idem.Store) {
		if !db.PrepareStmt {
			t.Skip("no statement cache without PrepareStmt")
		}
		ctx := t.Context()
		for i := range 5 {
			err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				_, err := store.Do(ctx, tx.Statement.ConnPool, idemtest.ChargeRequest(fmt.Sprint("cached-", i), "100"), func(ctx context.Context) (idem.Response, error) {
					return idem.Response{StatusCode: 201}, tx.Create(&charge{Ref: "cached", Amount: 1}).Error
				})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		keys := db.ConnPool.(*gorm.PreparedStmtDB).Stmts.Keys()
		for _, q := range keys {
			if strings.Contains(q, store.Table()) {
				t.Errorf("GORM's statement cache holds idem's %q", q)
			}
		}
		if len(keys) == 0 {
			t.Error("GORM's statement cache is empty: the test's own INSERT should be there")
		}
	})
}
