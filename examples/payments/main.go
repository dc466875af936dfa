// Command payments is a small card-payments API that shows idem's HTTP
// middleware: POST /v1/charges is safe to retry with an Idempotency-Key,
// and GET /v1/charges/{id} reads a charge back. It runs on PostgreSQL,
// MySQL or SQLite, chosen by the DSN, and charges cards through a fake
// provider that can be made slow or unreliable. See README.md.
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
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "address to listen on")
		dsn      = flag.String("dsn", "sqlite:payments.db", "database: postgres://user:pass@host:port/db, mysql://user:pass@host:port/db or sqlite:path (default $PAYMENTS_DSN, else a SQLite file)")
		delay    = flag.Duration("provider-delay", 0, "how long each call to the fake card provider takes")
		failRate = flag.Float64("provider-fail", 0, "fraction (0..1) of provider calls that fail without charging")
		lease    = flag.Duration("lease", 10*time.Second, "how long a charge in progress holds its key before a retry may take it over; also the deadline of its provider call")
	)
	flag.Parse()
	if env := os.Getenv("PAYMENTS_DSN"); env != "" && !flagSet("dsn") {
		*dsn = env
	}
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

// flagSet reports whether the flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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
	store, err := idem.New(dialect, cfg.idem...)
	if err != nil {
		return err
	}
	a := &app{db: db, dialect: dialect, store: store, charges: cfg.charges, provider: cfg.provider, log: cfg.log}
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

// open opens the database a DSN names and returns its dialect. The forms
// are those of the idem command: postgres://..., mysql://user:pass@host:port/db
// and sqlite:path (with the settings the SQLite dialect documents).
func open(dsn string) (*sql.DB, idem.Dialect, error) {
	driver, dialect, dsn, err := parseDSN(dsn)
	if err != nil {
		return nil, nil, err
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

// parseDSN returns the database/sql driver, the dialect and the DSN in the
// driver's own format.
func parseDSN(dsn string) (driver string, dialect idem.Dialect, driverDSN string, err error) {
	scheme, rest, _ := strings.Cut(dsn, ":")
	switch scheme {
	case "postgres", "postgresql":
		return "pgx", idem.Postgres, dsn, nil
	case "mysql":
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return "", nil, "", errors.New("a MySQL DSN is mysql://user:pass@host:port/db")
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
		return "mysql", idem.MySQL, cfg.FormatDSN(), nil
	case "sqlite":
		if rest == "" || strings.Contains(rest, "?") {
			return "", nil, "", errors.New("a SQLite DSN is sqlite:path/to/file.db, without parameters")
		}
		// Write lock at BEGIN, wait up to 10s for it, readers beside the
		// writer: see the documentation of idem.SQLite.
		return "sqlite", idem.SQLite, "file:" + rest + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)", nil
	}
	return "", nil, "", errors.New("unknown DSN scheme: want postgres://..., mysql://user:pass@host:port/db or sqlite:path")
}
