// Command payments is a small card-payments API that shows idem's HTTP
// middleware: POST /v1/charges is safe to retry with an Idempotency-Key,
// and GET /v1/charges/{id} reads a charge back. It runs on PostgreSQL or
// MySQL, chosen by the DSN, and charges cards through a fake provider that
// can be made slow or unreliable. See README.md.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
)

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "address to listen on")
		dsn      = flag.String("dsn", os.Getenv("PAYMENTS_DSN"), "database: postgres://user@host:port/db?sslmode=disable or mysql://user@tcp(host:port)/db (default $PAYMENTS_DSN)")
		delay    = flag.Duration("provider-delay", 0, "how long each call to the fake card provider takes")
		failRate = flag.Float64("provider-fail", 0, "fraction (0..1) of provider calls that fail without charging")
		lease    = flag.Duration("lease", 10*time.Second, "how long a charge in progress holds its key before a retry may take it over")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	provider := NewFakeProvider()
	provider.SetDelay(*delay)
	provider.SetFailRate(*failRate)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err == nil {
		log.Info("listening", "addr", "http://"+ln.Addr().String())
		err = run(ctx, ln, config{dsn: *dsn, provider: provider, charges: "charges", idem: []idem.Option{idem.WithLease(*lease)}, log: log})
	}
	if err != nil {
		log.Error("payments", "err", err)
		os.Exit(1)
	}
}

// config is what run needs besides the listener.
type config struct {
	dsn      string
	provider CardProvider
	charges  string        // the charges table
	idem     []idem.Option // options of the Store, e.g. its table
	log      *slog.Logger
}

// run serves the API on ln until ctx ends, then shuts down gracefully.
func run(ctx context.Context, ln net.Listener, cfg config) error {
	db, dialect, err := open(cfg.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	a := &app{db: db, dialect: dialect, store: idem.New(dialect, cfg.idem...), charges: cfg.charges, provider: cfg.provider, log: cfg.log}
	h, err := a.handler(ctx)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// open opens the database a DSN names and returns its dialect.
func open(dsn string) (*sql.DB, idem.Dialect, error) {
	var (
		driver  string
		dialect idem.Dialect
	)
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		driver, dialect = "pgx", idem.Postgres
	case strings.HasPrefix(dsn, "mysql://"):
		driver, dialect, dsn = "mysql", idem.MySQL, strings.TrimPrefix(dsn, "mysql://")
	case dsn == "":
		return nil, nil, errors.New("no database: pass -dsn or set PAYMENTS_DSN (postgres://... or mysql://...)")
	default:
		return nil, nil, errors.New("unknown DSN scheme: want postgres://... or mysql://user@tcp(host:port)/db")
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("reach the database: %w", err)
	}
	return db, dialect, nil
}
