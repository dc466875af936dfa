// Command payments is a small card-payments API that shows idem's HTTP
// middleware: POST /v1/charges is safe to retry with an Idempotency-Key,
// and GET /v1/charges/{id} reads a charge back. It runs on PostgreSQL,
// MySQL, MariaDB, TiDB or SQLite, chosen by the DSN (in any form the idem
// command takes), and charges cards through a fake provider that can be
// made slow or unreliable. See README.md.
package main

import (
	"context"
	"database/sql"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dburl"
)

// defaultDSN is the database when neither -dsn nor $PAYMENTS_DSN names one.
const defaultDSN = "sqlite:payments.db"

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "address to listen on")
		dsn      = flag.String("dsn", "", "database: "+dburl.Forms+", as the idem command takes them (default $PAYMENTS_DSN, else "+defaultDSN+")")
		delay    = flag.Duration("provider-delay", 0, "how long each call to the fake card provider takes")
		failRate = flag.Float64("provider-fail", 0, "fraction (0..1) of provider calls that fail without charging")
		lease    = flag.Duration("lease", 10*time.Second, "how long a charge in progress holds its key before a retry may take it over; also the deadline of its provider call")
	)
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("PAYMENTS_DSN")
	}
	if *dsn == "" {
		*dsn = defaultDSN
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	provider := NewFakeProvider()
	provider.SetDelay(*delay)
	provider.SetFailRate(*failRate)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := config{dsn: *dsn, provider: provider, charges: "charges", idem: []idem.Option{idem.WithLease(*lease)}, log: log}
	listen := func() (net.Listener, error) { return net.Listen("tcp", *addr) }
	if err := run(ctx, cfg, listen); err != nil {
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

// run reaches the database and creates the tables if they are absent,
// then listens and logs "listening", and serves the API until ctx ends,
// then shuts down gracefully. So a service that cannot reach its database
// never says it is listening, and a client that reaches it finds the
// tables.
func run(ctx context.Context, cfg config, listen func() (net.Listener, error)) error {
	db, dialect, err := open(ctx, cfg.dsn)
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
	ln, err := listen()
	if err != nil {
		return err
	}
	cfg.log.Info("listening", "addr", "http://"+ln.Addr().String())
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

// open opens the database a DSN names, in any form the idem command takes
// (package dburl: postgres://, mysql://, mariadb://, tidb://, sqlite: or
// file:, with the settings the SQLite dialect documents and, since the
// service creates its database, SQLite's WAL journal), checks that it
// answers, and returns its dialect.
func open(ctx context.Context, dsn string) (*sql.DB, idem.Dialect, error) {
	t, err := dburl.Parse(dsn)
	if err != nil {
		return nil, nil, err
	}
	db, err := t.WithWAL().Open(ctx)
	if err != nil {
		return nil, nil, err
	}
	return db, t.Dialect, nil
}
