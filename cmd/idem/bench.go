package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	_ "github.com/lib/pq"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bench"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		dsn, driver, conc string
		storms            int
		httpMode          bool
		cfg               bench.Config
	)
	fs := newFlags("bench", "--dsn DSN [--driver pgx|postgres] [--rounds 10] [--duration 300ms] [--concurrency 1,16] [--hot 16] [--storms 5] [--http]",
		"Measures idem against a bare transaction (BEGIN; INSERT one order row;\n"+
			"COMMIT) through one driver on one server: Do with a fresh key, Do replaying\n"+
			"a completed key (replay), the same through a Store that has not served the\n"+
			"key, as another instance behind a load balancer (cross), Begin then\n"+
			"Complete in the business transaction, and --hot workers replaying one hot\n"+
			"key. Each runs beside a bare run at the same concurrency, and fresh and\n"+
			"the replays also beside their floor, the cheapest hand-written\n"+
			"transaction that does their job: for fresh, a claim INSERT, the order row\n"+
			"and an UPDATE storing the response (floor); for replays, one SELECT of a\n"+
			"stored row (read). It prints transactions per second, median of the\n"+
			"rounds, and the ratios to bare and to the floor: each the median of the\n"+
			"ratios of paired runs, one pair a round, so not the ratio of the printed\n"+
			"medians.\n"+
			"Then storms of 64 requests with one key whose operation takes 50ms: time\n"+
			"until every request has its answer. Creates three tables with random\n"+
			"names and drops them. See docs/benchmarks.md.\n\n"+
			"With --http it measures the HTTP layer instead: loopback requests, each\n"+
			"path (a fresh key, a replay) served through idemhttp in transaction mode\n"+
			"and through a bare handler that calls Do in RunTx itself, in turn in\n"+
			"every round, at --concurrency client workers (default 8). It prints the\n"+
			"requests per second of both, the ratio (median of the rounds) and the\n"+
			"heap allocations per request, client and server together.", stderr)
	fs.StringVar(&dsn, "dsn", "", dsnUsage)
	fs.StringVar(&driver, "driver", "", "for postgres:// DSNs, the driver: pgx (the default) or postgres (lib/pq)")
	fs.IntVar(&cfg.Rounds, "rounds", 10, "rounds: each path runs once a round, beside a bare run")
	fs.DurationVar(&cfg.Duration, "duration", 300*time.Millisecond, "how long each run lasts")
	fs.StringVar(&conc, "concurrency", "1,16", "worker counts, comma-separated")
	fs.IntVar(&cfg.HotWorkers, "hot", 16, "workers replaying one hot key")
	fs.IntVar(&storms, "storms", 5, "storms per mode, latencies pooled (0: none)")
	fs.BoolVar(&httpMode, "http", false, "measure idemhttp against a bare handler calling Do, over loopback HTTP")
	if err := parse(fs, args); err != nil {
		return err
	}
	if httpMode {
		conc = "8"
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "concurrency" {
				conc = f.Value.String()
			}
		})
	}
	if cfg.Rounds <= 0 || cfg.Duration <= 0 || cfg.HotWorkers <= 0 || storms < 0 {
		return usageErr("bench: --rounds, --duration and --hot must be positive and --storms not negative")
	}
	for _, c := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			return usageErr("bench: --concurrency %q: want positive worker counts, comma-separated", conc)
		}
		cfg.Concurrency = append(cfg.Concurrency, n)
	}
	cfg.Storms = storms
	if storms == 0 {
		cfg.Storms = -1
	}
	dsn, err := dsnOrEnv(dsn)
	if err != nil {
		return err
	}
	t, err := parseDSN(ctx, dsn)
	if err != nil {
		return err
	}
	switch {
	case driver == "":
	case driver != "pgx" && driver != "postgres":
		return usageErr("bench: --driver %q: want pgx or postgres", driver)
	case t.Dialect != idem.Postgres:
		return usageErr("bench: --driver applies to postgres:// DSNs only")
	default:
		t.Driver = driver
	}
	db, err := connect(ctx, t.WithWAL())
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.DB, cfg.Driver, cfg.Dialect = db, t.Driver, t.Dialect
	if httpMode {
		hc := bench.HTTPConfig{DB: db, Driver: t.Driver, Dialect: t.Dialect, Rounds: cfg.Rounds, Duration: cfg.Duration, Concurrency: cfg.Concurrency}
		if _, err := bench.RunHTTP(ctx, hc, stdout); err != nil {
			return fmt.Errorf("bench --http on %s: %w", t.Where, err)
		}
		fmt.Fprintf(stdout, "The ratio is idemhttp's requests per second over the bare handler's in\n"+
			"the same round, median over %s.\n", plural(cfg.Rounds, "round"))
		return nil
	}
	if _, err := bench.Run(ctx, cfg, stdout); err != nil {
		return fmt.Errorf("bench on %s: %w", t.Where, err)
	}
	fmt.Fprintf(stdout, "Each ratio is the median over %s of the ratio of paired runs (a path's\n"+
		"tx/s over the bare or floor run beside it in the same round), so it need\n"+
		"not equal the ratio of the tx/s medians in the table.\n", plural(cfg.Rounds, "round"))
	return nil
}
