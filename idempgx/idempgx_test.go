package idempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/internal/testdb"
)

var (
	_ idempgx.DBTX       = (*pgxpool.Pool)(nil)
	_ idempgx.TxBeginner = (*pgxpool.Pool)(nil)
)

// TestMain points the runnable examples at the server the tests run on.
func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// The whole conformance suite runs on native pgx (target postgres-pgxnative
// in internal/conformance); these tests cover what is this package's own:
// its checks, its transactions and its claims' wrappers.

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// newStore makes an idempgx Store for Postgres.
func newStore(t *testing.T, opts ...idem.Option) *idempgx.Store {
	t.Helper()
	s, err := idem.New(idem.Postgres, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := idempgx.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// store makes a migrated Store on a table of the test's own, dropped when
// the test ends.
func store(t *testing.T, p *pgxpool.Pool, opts ...idem.Option) *idempgx.Store {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := "idempgx_" + hex.EncodeToString(b)
	ps := newStore(t, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	ctx := context.Background()
	if err := ps.Migrate(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return ps
}

func TestNewRefusesOtherDialects(t *testing.T) {
	if _, err := idempgx.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	s, err := idem.New(idem.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempgx.New(s); err == nil {
		t.Error("New accepted a MySQL Store")
	}
}

// Concurrent duplicates in pgx transactions run fn once, commit one business
// row, and every other one replays, through RunTx's retries where the
// isolation level aborts them.
func TestDoRunsOnce(t *testing.T) {
	p := pool(t)
	s := store(t, p)
	ctx := context.Background()
	rows := s.Idem().Table() + "_rows"
	if _, err := p.Exec(ctx, "CREATE TABLE "+rows+" (k text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE "+rows) })
	req := idem.Request{Scope: "s", Key: "k", Operation: "POST /x", Fingerprint: "f"}
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		req.Key = "k-" + strings.ReplaceAll(string(iso), " ", "-")
		const n = 8
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			replayed int
			errs     []error
		)
		for range n {
			wg.Go(func() {
				var res idem.Result
				err := idempgx.RunTx(ctx, p, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					var err error
					res, err = s.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
						if _, err := tx.Exec(ctx, "INSERT INTO "+rows+" VALUES ($1)", req.Key); err != nil {
							return idem.Response{}, err
						}
						time.Sleep(20 * time.Millisecond)
						return idem.Response{StatusCode: 201, Body: []byte("done")}, nil
					})
					return err
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case res.Replayed:
					replayed++
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("%s: %v", iso, errors.Join(errs...))
		}
		var count int
		if err := p.QueryRow(ctx, "SELECT count(*) FROM "+rows+" WHERE k = $1", req.Key).Scan(&count); err != nil {
			t.Fatal(err)
		}
		if count != 1 || replayed != n-1 {
			t.Errorf("%s: %d business rows and %d replays; want 1 and %d", iso, count, replayed, n-1)
		}
	}
}

// A claim from Begin is completed in a pgx transaction, and its record
// reads back through Inspect and Stats; Purge removes it past retention.
func TestClaimInspectPurge(t *testing.T) {
	p := pool(t)
	s := store(t, p, idem.WithRetention(time.Second))
	ctx := context.Background()
	req := idem.Request{Scope: "s", Key: "k", Operation: "POST /x", Fingerprint: "f"}
	c, replay, err := s.Begin(ctx, p, req)
	if err != nil || replay != nil {
		t.Fatalf("Begin: %v, %v", replay, err)
	}
	if _, _, err := s.Begin(ctx, p, req); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("second Begin: %v; want ErrInFlight", err)
	}
	if err := c.Extend(ctx, p, time.Minute); err != nil {
		t.Fatal(err)
	}
	err = idempgx.RunTx(ctx, p, pgx.TxOptions{}, func(tx pgx.Tx) error {
		return c.Complete(ctx, tx, idem.Response{StatusCode: 200, Body: []byte("ok")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, p); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Release after Complete: %v; want ErrLeaseLost", err)
	}
	rec, err := s.Inspect(ctx, p, req.Scope, req.Key)
	if err != nil || rec == nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "ok" {
		t.Fatalf("Inspect: %+v, %v", rec, err)
	}
	st, err := s.Stats(ctx, p)
	if err != nil || st.Total != 1 || st.ByStatus[idem.StatusCompleted] != 1 {
		t.Fatalf("Stats: %+v, %v", st, err)
	}
	time.Sleep(1100 * time.Millisecond)
	if n, err := s.Purge(ctx, p, 10); err != nil || n != 1 {
		t.Fatalf("Purge: %d, %v; want 1", n, err)
	}
	if rec, err := s.Inspect(ctx, p, req.Scope, req.Key); err != nil || rec != nil {
		t.Fatalf("Inspect after Purge: %+v, %v", rec, err)
	}
}

func TestNilHandles(t *testing.T) {
	ps := newStore(t)
	ctx := context.Background()
	fn := func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 200}, nil }
	var c *idempgx.Claim
	for name, err := range map[string]error{
		"Do":       func() error { _, err := ps.Do(ctx, nil, idem.Request{}, fn); return err }(),
		"Begin":    func() error { _, _, err := ps.Begin(ctx, nil, idem.Request{}); return err }(),
		"Migrate":  ps.Migrate(ctx, nil),
		"Purge":    func() error { _, err := ps.Purge(ctx, nil, 1); return err }(),
		"Inspect":  func() error { _, err := ps.Inspect(ctx, nil, "s", "k"); return err }(),
		"Stats":    func() error { _, err := ps.Stats(ctx, nil); return err }(),
		"Complete": c.Complete(ctx, nil, idem.Response{}),
		"RunTx":    idempgx.RunTx(ctx, nil, pgx.TxOptions{}, nil),
	} {
		if err == nil {
			t.Errorf("%s with a nil handle succeeded", name)
		}
	}
}
