//go:build linux

package failover_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
)

// On a primary whose standby is gone, nothing it commits is answered:
// the middleware's fresh answer and its replay are both 503 not-replicated
// with Retry-After, the handler ran once and its row stands; a caller of
// Do gets ErrNotReplicated from WaitReplicated on database/sql (pgx's
// driver and lib/pq) and on native pgx; a role that may not read the
// standbys' positions is told so at once. With the standby streaming
// again, the same key replays.
func TestNotReplicatedAnswers(t *testing.T) {
	tpl := newTemplate(t)
	store, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	c := tpl.startCluster(t, "answers", 0, func(db *sql.DB) error {
		if err := store.Migrate(context.Background(), db); err != nil {
			return err
		}
		_, err := db.Exec(`CREATE TABLE payments (id bigserial PRIMARY KEY, pay_key text NOT NULL, charge text NOT NULL)`)
		return err
	})
	db := c.primary.open(t)
	ctx := context.Background()
	// On an idle primary, whose insert position stands past the header of
	// a segment that holds nothing yet, the wait ends at once, under
	// synchronous_commit on and off.
	if _, err := db.Exec(`SELECT pg_switch_wal()`); err != nil {
		t.Fatal(err)
	}
	async, err := sql.Open("pgx", dsn(c.primary.addr())+"&synchronous_commit=off")
	if err != nil {
		t.Fatal(err)
	}
	defer async.Close()
	for name, db := range map[string]*sql.DB{"synchronous_commit on": db, "synchronous_commit off": async} {
		if err := store.WaitReplicated(ctx, db, 1, 5*time.Second); err != nil {
			t.Errorf("%s, with the standby streaming: %v", name, err)
		}
	}
	if err := store.WaitReplicated(ctx, db, 2, 50*time.Millisecond); !errors.Is(err, idem.ErrNotReplicated) || !strings.Contains(err.Error(), "reached 1 of 2 standbys") {
		t.Errorf("2 standbys of 1: %v, want ErrNotReplicated, 1 of 2", err)
	}
	c.standby.stop()

	const wait = 100 * time.Millisecond
	b := &bank{store: store, db: db, calls: map[string]int{}}
	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db, Scope: idemhttp.SingleTenant, Standbys: 1, StandbyWait: wait,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := b.pay(r.Context(), idemhttp.TxFrom(r.Context()), "k1")
		if err != nil {
			mw.Fail(w, r, err)
			return
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(resp.Body)
	})))
	defer srv.Close()
	post := func() (*http.Response, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		_ = json.Unmarshal(body, &p)
		return resp, p
	}
	for attempt := range 2 { // the first runs the handler, the second would replay it
		resp, p := post()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || p["type"] != idemhttp.TypeNotReplicated ||
			!strings.Contains(p["detail"].(string), "outcome is unknown") {
			t.Errorf("attempt %d: %d, Retry-After %q, %v; want 503 %s with Retry-After 1", attempt, resp.StatusCode, resp.Header.Get("Retry-After"), p, idemhttp.TypeNotReplicated)
		}
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM payments WHERE pay_key = 'k1'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || b.calls["k1"] != 1 {
		t.Errorf("%d rows and %d calls of the handler; want 1 and 1: the answer is withheld, not the commit", rows, b.calls["k1"])
	}

	pq, err := sql.Open("postgres", dsn(c.primary.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	pool, err := pgxpool.New(ctx, dsn(c.primary.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, wait := range map[string]func() error{
		"pgx's database/sql driver": func() error { return store.WaitReplicated(ctx, db, 1, wait) },
		"lib/pq":                    func() error { return store.WaitReplicated(ctx, pq, 1, wait) },
		"native pgx":                func() error { return store.WaitReplicatedOn(ctx, idempgx.Conn(pool), 1, wait) },
	} {
		start := time.Now()
		err := wait()
		var nr *idem.NotReplicatedError
		if !errors.As(err, &nr) || nr.Reached != 0 || nr.Want != 1 || !strings.HasPrefix(nr.Position, "0/") || time.Since(start) < 100*time.Millisecond {
			t.Errorf("%s: %v after %v; want a NotReplicatedError, 0 of 1, after 100ms", name, err, time.Since(start))
		}
	}

	if _, err := db.Exec(`CREATE ROLE clerk LOGIN`); err != nil {
		t.Fatal(err)
	}
	clerk, err := sql.Open("pgx", strings.Replace(dsn(c.primary.addr()), "postgres@", "clerk@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer clerk.Close()
	if err := store.WaitReplicated(ctx, clerk, 1, time.Minute); err == nil || errors.Is(err, idem.ErrNotReplicated) || !strings.Contains(err.Error(), "pg_stat_replication") {
		t.Errorf("a role without pg_monitor: %v; want an error that says it cannot read pg_stat_replication", err)
	} else if e := (*idem.Error)(nil); !errors.As(err, &e) || !strings.Contains(e.Hint, "pg_monitor") {
		t.Errorf("a role without pg_monitor: hint %q, want one naming pg_monitor", e.Hint)
	}

	c.standby = tpl.start(t, c.standby.dir, "hot_standby=on")
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, _ := post()
		if resp.StatusCode == http.StatusCreated && resp.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the standby back: %d, want 201 replayed", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b.calls["k1"] != 1 {
		t.Errorf("%d calls of the handler, want 1", b.calls["k1"])
	}
}
