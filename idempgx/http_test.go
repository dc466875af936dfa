package idempgx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/internal/testdb"
)

// Middleware refuses what it cannot run on: no pool, database/sql's DB or
// TxOptions, no Store or one for another dialect; and idemhttp's own
// checks still hold.
func TestMiddlewareChecksConfig(t *testing.T) {
	p := &pgxpool.Pool{}
	pg, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	my, err := idem.New(idem.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		pool *pgxpool.Pool
		cfg  idemhttp.Config
		want string
	}{
		"no pool":         {nil, idemhttp.Config{Store: pg, Scope: idemhttp.SingleTenant}, "needs a *pgxpool.Pool"},
		"a DB":            {p, idemhttp.Config{Store: pg, DB: &sql.DB{}, Scope: idemhttp.SingleTenant}, "leave Config.DB and Config.TxOptions unset"},
		"sql TxOptions":   {p, idemhttp.Config{Store: pg, TxOptions: &sql.TxOptions{}, Scope: idemhttp.SingleTenant}, "pass pgx.TxOptions"},
		"no Store":        {p, idemhttp.Config{Scope: idemhttp.SingleTenant}, "needs Config.Store"},
		"a MySQL Store":   {p, idemhttp.Config{Store: my, Scope: idemhttp.SingleTenant}, "Middleware needs Config.Store for idem.Postgres, got one for mysql"},
		"no Scope":        {p, idemhttp.Config{Store: pg}, "idemhttp.SingleTenant"},
		"Set-Cookie kept": {p, idemhttp.Config{Store: pg, Scope: idemhttp.SingleTenant, ReplayHeaders: []string{"Set-Cookie"}}, "cookie"},
	} {
		m, err := idempgx.Middleware(c.pool, pgx.TxOptions{}, c.cfg)
		if err == nil || m != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, %v; want an error saying %q", name, m, err, c.want)
		}
	}
}

// Behind idempgx's middleware the handler gets its pgx.Tx (begun with
// Middleware's options) and claim from idempgx, and nothing from
// idemhttp's TxFrom and ClaimFrom; behind idemhttp's, on database/sql,
// the other way round. The rows it writes commit once with the key: the
// second request replays.
func TestFromOneDriverOnly(t *testing.T) {
	p := pool(t)
	s := store(t, p)
	ctx := context.Background()
	rows := s.Idem().Table() + "_rows"
	if _, err := p.Exec(ctx, "CREATE TABLE "+rows+" (k text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE "+rows) })
	db, err := sql.Open("pgx", testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })

	for _, mode := range []idemhttp.Mode{idemhttp.ModeTransaction, idemhttp.ModeClaim} {
		claimed := mode == idemhttp.ModeClaim
		mw, err := idempgx.Middleware(p, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, idemhttp.Config{Store: s.Idem(), Scope: idemhttp.SingleTenant, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("pgx-%d", mode)
		postTwice(t, mw, key, func(ctx context.Context) error {
			if idemhttp.TxFrom(ctx) != nil || idemhttp.ClaimFrom(ctx) != nil {
				return errors.New("idemhttp's TxFrom or ClaimFrom returned a value behind idempgx's middleware")
			}
			if (idempgx.ClaimFrom(ctx) != nil) != claimed {
				return fmt.Errorf("ClaimFrom %v in mode %d", idempgx.ClaimFrom(ctx), mode)
			}
			tx := idempgx.TxFrom(ctx)
			var iso string
			if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "repeatable read" {
				return fmt.Errorf("the handler's transaction is %q (%v), want repeatable read", iso, err)
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+rows+" VALUES ($1)", key)
			return err
		})

		mw, err = idemhttp.New(idemhttp.Config{Store: s.Idem(), DB: db, Scope: idemhttp.SingleTenant, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		key = fmt.Sprintf("sql-%d", mode)
		postTwice(t, mw, key, func(ctx context.Context) error {
			if idempgx.TxFrom(ctx) != nil || idempgx.ClaimFrom(ctx) != nil {
				return errors.New("idempgx's TxFrom or ClaimFrom returned a value behind idemhttp's middleware")
			}
			if (idemhttp.ClaimFrom(ctx) != nil) != claimed {
				return fmt.Errorf("idemhttp.ClaimFrom %v in mode %d", idemhttp.ClaimFrom(ctx), mode)
			}
			_, err := idemhttp.TxFrom(ctx).ExecContext(ctx, "INSERT INTO "+rows+" VALUES ($1)", key)
			return err
		})
	}
	if idempgx.TxFrom(ctx) != nil || idempgx.ClaimFrom(ctx) != nil {
		t.Error("TxFrom or ClaimFrom outside the middleware returned a value")
	}
	for _, k := range []string{"pgx-0", "pgx-1", "sql-0", "sql-1"} {
		var n int
		if err := p.QueryRow(ctx, "SELECT count(*) FROM "+rows+" WHERE k = $1", k).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: %d rows (%v), want 1", k, n, err)
		}
	}
}

// postTwice sends two POSTs with key through mw to a handler that runs
// work and answers 201, or 500 with work's error, and wants a 201 and
// its replay.
func postTwice(t *testing.T, mw *idemhttp.Middleware, key string, work func(ctx context.Context) error) {
	t.Helper()
	var (
		mu   sync.Mutex
		errs []error
	)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := work(r.Context()); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	for i := range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		err = errors.Join(errs...)
		mu.Unlock()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if replayed := resp.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true"; resp.StatusCode != http.StatusCreated || replayed != (i == 1) {
			t.Fatalf("%s, request %d: %d replayed=%v; want 201, then its replay", key, i+1, resp.StatusCode, replayed)
		}
	}
}
