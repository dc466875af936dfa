// The idem demo command: its flags, the tables of one run (created and
// dropped), and the loop that plays each scenario and prints the table of
// outcomes. The scenarios are in demo_scenarios.go, the naive design they
// are measured against in demo_naive.go.

package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dburl"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		dsn   string
		burst int
	)
	fs := newFlags("demo", "[--dsn DSN] [--burst 16]",
		"Acts out the failures idem exists for, each twice on the same database: with\n"+
			"idem, and with a naive design that caches responses (check the cache, run,\n"+
			"store the response, no transaction in common). Prints two lines per\n"+
			"scenario, its verdict and what in idem held, then a closing table, within\n"+
			"80 columns. Without --dsn it uses an embedded SQLite database in a\n"+
			"temporary directory and needs no server. It works on tables of its own,\n"+
			"dropped at the end. Exit code 1 if an invariant of idem breaks.", stderr)
	fs.StringVar(&dsn, "dsn", "", "run on this database instead: "+dburl.Forms)
	fs.IntVar(&burst, "burst", 16, "concurrent retries in the burst scenario (2..40)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if burst < 2 || burst > 40 {
		return usageErr("demo: --burst must be between 2 and 40, got %d", burst)
	}
	embedded := dsn == ""
	if embedded {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = "sqlite:" + filepath.Join(dir, "demo.db")
	}
	t, err := parseDSN(ctx, dsn)
	if err != nil {
		return err
	}
	t = t.WithWAL()
	db, err := connect(ctx, t)
	if err != nil {
		return err
	}
	defer db.Close()
	d, err := newDemo(ctx, db, t, burst)
	if err != nil {
		return err
	}
	defer d.drop()
	where := t.Where
	if embedded {
		where = "an embedded SQLite database in a temporary directory"
	}
	fmt.Fprintf(stdout, "idem demo on %s\n", where)
	fmt.Fprintln(stdout, "Each failure is played twice, with idem and with a naive response cache,")
	fmt.Fprintf(stdout, "on tables %s* that are dropped at the end.\n\n", d.prefix)
	return d.run(ctx, stdout)
}

// demo holds the tables of one run: idem's, the charges idem guards, and
// the naive design's cache and charges.
type demo struct {
	db     *sql.DB
	t      dburl.Target
	bind   int // sqlx bind type for the driver
	burst  int
	prefix string
	store  *idem.Store
	claims *idem.Store  // the same table, with a short lease, for Begin
	seq    atomic.Int64 // charge ids
	// The charges idem guards, the naive design's cache and charges, and
	// the payment provider's charges.
	charges, naiveCache, naiveCharges, provider string
}

func newDemo(ctx context.Context, db *sql.DB, t dburl.Target, burst int) (*demo, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := "idem_demo_" + hex.EncodeToString(b) + "_"
	store, err := idem.New(t.Dialect, idem.WithTable(p+"keys"))
	if err != nil {
		return nil, err
	}
	claims, err := idem.New(t.Dialect, idem.WithTable(p+"keys"), idem.WithLease(demoLease))
	if err != nil {
		return nil, err
	}
	d := &demo{
		db: db, t: t, bind: sqlx.BindType(t.Driver), burst: burst, prefix: p,
		store: store, claims: claims,
		charges: p + "charges", naiveCache: p + "naive_cache", naiveCharges: p + "naive_charges",
		provider: p + "provider",
	}
	if err := d.store.Migrate(ctx, db); err != nil {
		d.drop()
		return nil, err
	}
	for _, stmt := range []string{
		"CREATE TABLE " + d.charges + " (idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
		"CREATE TABLE " + d.naiveCharges + " (idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
		"CREATE TABLE " + d.naiveCache + " (idem_key VARCHAR(255) NOT NULL PRIMARY KEY, body VARCHAR(1000) NOT NULL)",
		"CREATE TABLE " + d.provider + " (provider_key VARCHAR(255) NOT NULL PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			d.drop()
			return nil, fmt.Errorf("demo: create its tables: %w", err)
		}
	}
	return d, nil
}

// drop removes the demo's tables, whatever happened.
func (d *demo) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range []string{d.store.Table(), d.charges, d.naiveCache, d.naiveCharges, d.provider} {
		_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
	}
}

func (d *demo) q(query string) string { return sqlx.Rebind(d.bind, query) }

// outcome is what one scenario found: a cell of the closing table for
// each design, why idem held (what in it made the outcome), and the
// broken invariant of idem, if any.
type outcome struct {
	idem, naive string
	why         string
	broken      error
}

// scenario is one failure story, played with idem and with the naive cache.
type scenario struct {
	title string
	run   func(d *demo, ctx context.Context, key string) (outcome, error)
}

func (d *demo) run(ctx context.Context, stdout io.Writer) error {
	scs := d.scenarios()
	type row struct {
		title string
		outcome
	}
	var rows []row
	broken := 0
	for i, sc := range scs {
		fmt.Fprintf(stdout, "[%d/%d] %s ... ", i+1, len(scs), sc.title)
		start := time.Now()
		o, err := sc.run(d, ctx, fmt.Sprintf("pay-%d", i+1))
		if err != nil {
			fmt.Fprintln(stdout, "error")
			return fmt.Errorf("demo: %s: %w", sc.title, err)
		}
		took := time.Since(start).Round(time.Millisecond)
		if o.broken != nil {
			fmt.Fprintf(stdout, "INVARIANT BROKEN (%s)\n      %v\n", took, o.broken)
			broken++
		} else {
			fmt.Fprintf(stdout, "ok (%s)\n      held by %s\n", took, o.why)
		}
		rows = append(rows, row{sc.title, o})
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tWITH IDEM\tNAIVE CACHE\tIDEM OK")
	for _, r := range rows {
		ok := "yes"
		if r.broken != nil {
			ok = "NO"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.title, r.idem, r.naive, ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if broken > 0 {
		return failure("demo: %d of %d scenarios broke an invariant", broken, len(scs))
	}
	fmt.Fprintln(stdout, "Every invariant held: with idem, each payment was charged exactly once.")
	return nil
}
