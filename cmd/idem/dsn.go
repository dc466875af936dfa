package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"os"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dburl"
)

// parseDSN reads a DSN in one of the forms of package dburl. It first hands
// every part of dsn that could hold a password to the redactor in ctx, so
// that no error printed later shows one; dburl's messages never quote the
// DSN or any part of it but the scheme.
func parseDSN(ctx context.Context, dsn string) (dburl.Target, error) {
	redactorFrom(ctx).add(dsnSecrets(dsn)...)
	t, err := dburl.Parse(dsn)
	if err != nil {
		return t, usageErr("%v", err)
	}
	return t, nil
}

// dbFlags are the flags every database subcommand takes.
type dbFlags struct {
	dsn   string
	table string
}

// dsnUsage is the usage of the --dsn flag of the commands that need a
// database.
const dsnUsage = "database: " + dburl.Forms + " (default $IDEM_DSN)"

// dsnOrEnv is the --dsn flag's value, or $IDEM_DSN when it is empty (not
// the flag's default: --help would print the password).
func dsnOrEnv(dsn string) (string, error) {
	if dsn == "" {
		dsn = os.Getenv("IDEM_DSN")
	}
	if dsn == "" {
		return "", usageErr("--dsn is required (or set IDEM_DSN)")
	}
	return dsn, nil
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dsn, "dsn", "", dsnUsage)
	fs.StringVar(&f.table, "table", idem.DefaultTable, "the idempotency table, optionally schema-qualified")
}

// open makes the Store the flags name and connects to their database,
// checking that it answers. create allows a SQLite file that does not exist
// yet; other commands refuse it rather than leave an empty file behind.
func (f *dbFlags) open(ctx context.Context, create bool, opts ...idem.Option) (*sql.DB, dburl.Target, *idem.Store, error) {
	dsn, err := dsnOrEnv(f.dsn)
	if err != nil {
		return nil, dburl.Target{}, nil, err
	}
	t, err := parseDSN(ctx, dsn)
	if err != nil {
		return nil, t, nil, err
	}
	s, err := idem.New(t.Dialect, append([]idem.Option{idem.WithTable(f.table)}, opts...)...)
	if err != nil {
		return nil, t, nil, usageErr("%v", err)
	}
	switch {
	case create:
		t = t.WithWAL()
	case t.File != "":
		if _, err := os.Stat(t.File); err != nil {
			return nil, t, nil, usageErr("no SQLite database at %s: %v", t.File, errors.Unwrap(err))
		}
	}
	db, err := connect(ctx, t)
	return db, t, s, err
}

// connect opens t and pings it; any failure is exit code 2 with one line.
func connect(ctx context.Context, t dburl.Target) (*sql.DB, error) {
	db, err := t.Open(ctx)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	return db, nil
}
