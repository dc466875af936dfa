package idemgorm_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgorm"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

// TestMain points the runnable examples at the server the tests run on.
func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// charge is the tests' business row: one per charge, by the request's
// key.
type charge struct {
	ID     int64
	Ref    string `gorm:"size:255;index"`
	Amount int64
}

// servers are the databases every test runs on: a schema or database of
// the test's own on each server.
var servers = []struct {
	name string
	open func(t *testing.T) idemtest.Database
}{
	{"PostgreSQL", idemtest.PostgresDatabase},
	{"MariaDB", idemtest.MariaDBDatabase},
}

// eachDB runs test on each server, with GORM opened there as a service
// opens it, with and without PrepareStmt.
func eachDB(t *testing.T, test func(t *testing.T, db *gorm.DB, store *idem.Store)) {
	for _, srv := range servers {
		for _, prepared := range []bool{false, true} {
			name := srv.name
			if prepared {
				name += "/PrepareStmt"
			}
			t.Run(name, func(t *testing.T) {
				d := srv.open(t)
				db := open(t, d, prepared)
				test(t, db, newStore(t, d.Dialect, db))
			})
		}
	}
}

// open opens GORM on d and migrates the charges table.
func open(t *testing.T, d idemtest.Database, prepared bool) *gorm.DB {
	t.Helper()
	dialector := postgres.Open(d.DSN)
	if d.Dialect != idem.Postgres {
		dialector = mysql.Open(d.DSN)
	}
	db, err := gorm.Open(dialector, &gorm.Config{PrepareStmt: prepared, Logger: logger.Discard})
	if err != nil {
		t.Fatalf("gorm.Open: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	sqlDB.SetMaxOpenConns(2 * idemtest.StormSize)
	if err := db.AutoMigrate(&charge{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	return db
}

// newStore is idem's Store on db's database, migrated.
func newStore(t *testing.T, d idem.Dialect, db *gorm.DB) *idem.Store {
	t.Helper()
	store, err := idem.New(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), sqlDB(t, db)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return store
}

func sqlDB(t *testing.T, db *gorm.DB) *sql.DB {
	t.Helper()
	s, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rows counts the committed charges of key.
func rows(db *gorm.DB) func(ctx context.Context, key string) (int, error) {
	return func(ctx context.Context, key string) (int, error) {
		var n int64
		err := db.WithContext(ctx).Model(&charge{}).Where("ref = ?", key).Count(&n).Error
		return int(n), err
	}
}

// A GORM service's own transaction: db.Transaction, at the isolation
// level its options ask for, retried by idem.Retry, with
// tx.Statement.ConnPool handed to Do.
func TestTransaction(t *testing.T) {
	eachDB(t, func(t *testing.T, db *gorm.DB, store *idem.Store) {
		idemtest.RunStack(t, idemtest.Stack{
			Name:  "GORM's db.Transaction",
			Store: store,
			DB:    sqlDB(t, db),
			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
				var res idem.Result
				err := idem.Retry(ctx, func() error {
					return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						var err error
						res, err = store.Do(ctx, tx.Statement.ConnPool, req, func(ctx context.Context) (idem.Response, error) {
							c := charge{Ref: req.Key, Amount: 100}
							if err := tx.Create(&c).Error; err != nil {
								return idem.Response{}, err
							}
							if err := then(); err != nil {
								return idem.Response{}, err
							}
							return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(c.ID)}, nil
						})
						return err
					}, &sql.TxOptions{Isolation: iso})
				})
				return res, err
			},
			Rows: rows(db),
		})
	})
}

// thenKey carries the harness's then to the handler, through the
// request's context (idemhttp keeps its values).
type thenKey struct{}

// then is the harness's then for one request, and the error it returned.
type then struct {
	fn  func() error
	err error
}

// chargeHandler is a GORM handler behind idemhttp: it writes the charge
// through the request's transaction, bound with WithTx.
func chargeHandler(db *gorm.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Amount int64 }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, _ := idemhttp.RequestFrom(r.Context())
		tx := idemgorm.WithTx(r.Context(), db, idemhttp.TxFrom(r.Context()))
		c := charge{Ref: req.Key, Amount: in.Amount}
		if err := tx.Create(&c).Error; err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		th := r.Context().Value(thenKey{}).(*then)
		if th.err = th.fn(); th.err != nil {
			http.Error(w, th.err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(idemtest.ChargeBody(c.ID))
	})
}

// A GORM handler under idemhttp's ModeTransaction, driven through
// httptest: the middleware runs Do, and the handler writes through
// WithTx. A request's payload is its Fingerprint, so that another
// fingerprint is another body (a 422).
func TestHandlerUnderIdemhttp(t *testing.T) {
	eachDB(t, func(t *testing.T, db *gorm.DB, store *idem.Store) {
		handlers := map[sql.IsolationLevel]http.Handler{}
		for _, iso := range append([]sql.IsolationLevel{sql.LevelDefault}, idemtest.StormLevels...) {
			mw, err := idemhttp.New(idemhttp.Config{
				Store:     store,
				DB:        sqlDB(t, db),
				TxOptions: &sql.TxOptions{Isolation: iso},
				Scope:     func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
				Required:  true,
			})
			if err != nil {
				t.Fatal(err)
			}
			handlers[iso] = mw.Handler(chargeHandler(db))
		}
		idemtest.RunStack(t, idemtest.Stack{
			Name:  "a GORM handler under idemhttp",
			Store: store,
			DB:    sqlDB(t, db),
			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, fn func() error) (idem.Result, error) {
				th := &then{fn: fn}
				body := fmt.Sprintf(`{"amount": 100, "payload": %q}`, req.Fingerprint)
				r := httptest.NewRequestWithContext(context.WithValue(ctx, thenKey{}, th), http.MethodPost, "/v1/charges", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set(idemhttp.HeaderIdempotencyKey, `"`+req.Key+`"`)
				r.Header.Set("X-Tenant", req.Scope)
				w := httptest.NewRecorder()
				handlers[iso].ServeHTTP(w, r)
				resp := w.Result()
				got, _ := io.ReadAll(resp.Body)
				switch {
				case resp.StatusCode == http.StatusUnprocessableEntity:
					return idem.Result{}, fmt.Errorf("%w: HTTP 422: %s", idem.ErrMismatch, got)
				case resp.StatusCode >= 500 && th.err != nil:
					return idem.Result{}, fmt.Errorf("HTTP %d: %w", resp.StatusCode, th.err)
				case resp.StatusCode >= 400:
					return idem.Result{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, got)
				}
				return idem.Result{
					Response: idem.Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: got},
					Replayed: resp.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true",
				}, nil
			},
			Rows: rows(db),
		})
	})
}

// WithTx binds a *gorm.DB to the transaction, PrepareStmt or not: what it
// writes rolls back with it, a db.Transaction on it is a savepoint in
// it (its error undoes only its own rows), and a nil transaction fails
// every statement, writing nothing.
func TestWithTx(t *testing.T) {
	eachDB(t, func(t *testing.T, db *gorm.DB, _ *idem.Store) {
		ctx := t.Context()
		count := rows(db)
		tx, err := sqlDB(t, db).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		bound := idemgorm.WithTx(ctx, db, tx)
		if err := bound.Create(&charge{Ref: "with-tx", Amount: 1}).Error; err != nil {
			t.Fatalf("Create through WithTx: %v", err)
		}
		errInner := errors.New("the nested transaction fails")
		err = bound.Transaction(func(inner *gorm.DB) error {
			if err := inner.Create(&charge{Ref: "with-tx", Amount: 2}).Error; err != nil {
				return err
			}
			return errInner
		})
		if !errors.Is(err, errInner) {
			t.Fatalf("nested Transaction: %v, want its own error", err)
		}
		var inTx int64
		if err := bound.Model(&charge{}).Where("ref = ?", "with-tx").Count(&inTx).Error; err != nil || inTx != 1 {
			t.Fatalf("inside the transaction: %d charges (%v), want 1: the savepoint's undone, the first kept", inTx, err)
		}
		if n, err := count(ctx, "with-tx"); err != nil || n != 0 {
			t.Fatalf("outside the open transaction: %d charges (%v), want 0: WithTx wrote apart from it", n, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatalf("rollback: %v (did the nested Transaction commit the transaction?)", err)
		}
		if n, err := count(ctx, "with-tx"); err != nil || n != 0 {
			t.Fatalf("after rollback: %d charges (%v), want 0", n, err)
		}

		err = idemgorm.WithTx(ctx, db, nil).Create(&charge{Ref: "no-tx", Amount: 1}).Error
		if err == nil || !strings.Contains(err.Error(), "nil *sql.Tx") || !strings.Contains(err.Error(), "c.Request.Context()") || !strings.Contains(err.Error(), "idemgin.TxFrom(c)") {
			t.Fatalf("Create through WithTx(nil): %v, want an error that says there is no transaction, and which context to pass under gin", err)
		}
		if n, err := count(ctx, "no-tx"); err != nil || n != 0 {
			t.Fatalf("after WithTx(nil): %d charges (%v), want 0", n, err)
		}
	})
}
