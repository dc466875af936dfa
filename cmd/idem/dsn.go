package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

// sqliteDefaults are connection settings the SQLite dialect documents;
// parseSQLite adds each one the DSN does not set itself. journal_mode is
// not among them: it changes the file for good, so only the commands that
// create one set it (withWAL).
var sqliteDefaults = []struct{ key, match, value string }{
	{"_txlock", "_txlock=", "immediate"},
	{"_pragma", "busy_timeout", "busy_timeout(10000)"},
}

// withWAL adds journal_mode(WAL) to a SQLite target whose DSN does not set a
// journal mode, for the commands that create the database.
func withWAL(t target) target {
	if t.file != "" && !strings.Contains(t.dsn, "journal_mode") {
		t.dsn += "&_pragma=journal_mode(WAL)"
	}
	return t
}

// target is a parsed DSN: the dialect, the database/sql driver and the DSN
// in that driver's own format.
type target struct {
	dialect idem.Dialect
	driver  string
	dsn     string
	where   string // for messages: host:port or file, never the password
	file    string // SQLite: the database file
}

// parseDSN reads postgres://, postgresql://, mysql://, mariadb://, tidb://, sqlite: and file:
// DSNs, the scheme in any case. It first hands every part of dsn that could
// hold a password to the redactor in ctx, so that no error printed later
// shows one; its own messages never quote the DSN or any part of it but
// the scheme.
func parseDSN(ctx context.Context, dsn string) (target, error) {
	redactorFrom(ctx).add(dsnSecrets(dsn)...)
	scheme, rest, ok := strings.Cut(dsn, ":")
	if !ok || !validScheme(scheme) {
		return target{}, usageErr("%s", noScheme(dsn))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := parseURL(dsn, "Postgres")
		if err != nil {
			return target{}, err
		}
		// pgx recognises only the lower-case schemes and reads anything
		// else as key=value settings, quoting the whole DSN in its error.
		return target{dialect: idem.Postgres, driver: "pgx", dsn: "postgres" + dsn[len(scheme):],
			where: "postgres at " + hostOr(u.Host, "localhost:5432")}, nil
	case "mysql":
		return parseMySQL(dsn, idem.MySQL, "3306")
	case "mariadb":
		return parseMySQL(dsn, idem.MariaDB, "3306")
	case "tidb":
		return parseMySQL(dsn, idem.TiDB, "4000")
	case "sqlite", "file":
		return parseSQLite(rest)
	}
	if !strings.HasPrefix(rest, "//") {
		return target{}, usageErr("%s", noScheme(dsn))
	}
	return target{}, usageErr("unknown DSN scheme %q; use postgres://, postgresql://, mysql://, mariadb://, tidb://, sqlite: or file:", scheme)
}

// validScheme reports an RFC 3986 scheme: a letter, then letters, digits,
// '+', '-' or '.'. Only such a word is ever quoted back; a key=value DSN
// cut at its first ':' would show its password.
func validScheme(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return true
}

// noScheme explains a DSN without a known scheme, quoting none of it.
func noScheme(dsn string) string {
	const forms = "use postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db, sqlite:path or file:path"
	first, _, _ := strings.Cut(dsn, ":")
	switch {
	case strings.Contains(first, "="):
		return "a key=value DSN is not accepted; write it as postgres://user:pass@host:5432/db?param=value (percent-encode the password)"
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix("):
		return "a go-sql-driver DSN (user:pass@tcp(host:port)/db) is not accepted; write it as mysql://user:pass@host:port/db"
	}
	return "the DSN (not shown: it may hold a password) has no known scheme; " + forms
}

// parseURL parses a postgres:// or mysql:// DSN. Its errors say what to
// fix without quoting the DSN: url.Parse's own would quote it, or a piece of
// a password that a raw '/', '?' or '#' cut off as a host or port.
func parseURL(dsn, name string) (*url.URL, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, usageErr("the %s DSN (not shown: it may hold a password) is not a valid URL; percent-encode the user name and password (%%40 for @, %%3A for :, %%2F for /, %%3F for ?, %%23 for #, %%25 for %%, %%20 for a space)", name)
	}
	if _, after, _ := strings.Cut(dsn, "://"); strings.Count(after, "@") > 1 ||
		strings.Contains(after[strings.IndexAny(after+"/", "/?#"):], "@") {
		// A raw '/', '?' or '#' in the password ends the host part early,
		// and drivers split a raw '@' differently (pgx at the first, like
		// libpq; net/url at the last): a driver would take a piece of the
		// password for the host (and look it up in DNS) or the database.
		return nil, usageErr("the %s DSN (not shown: it may hold a password) has more than one '@' or one after its host; percent-encode '@', '/', '?' and '#' in the user name and password (%%40, %%2F, %%3F, %%23)", name)
	}
	return u, nil
}

func hostOr(h, def string) string {
	if h == "" {
		return def
	}
	return h
}

// parseMySQL turns mysql://user:pass@host:port/db?params (or tidb://...)
// into go-sql-driver's user:pass@tcp(host:port)/db?params, for dialect d,
// whose server listens on port by default.
func parseMySQL(dsn string, d idem.Dialect, port string) (target, error) {
	name := map[idem.Dialect]string{idem.MySQL: "MySQL", idem.MariaDB: "MariaDB", idem.TiDB: "TiDB"}[d]
	u, err := parseURL(dsn, name)
	if err != nil {
		return target{}, err
	}
	if u.Host == "" {
		return target{}, usageErr("%s DSN needs a host: %s://user:pass@host:%s/db", name, d.Name(), port)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), port)
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
	if err != nil {
		return target{}, usageErr("bad %s DSN parameters: %v", name, err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return target{dialect: d, driver: "mysql", dsn: cfg.FormatDSN(), where: d.Name() + " at " + host}, nil
}

// parseSQLite turns sqlite:path or file:path into modernc.org/sqlite's
// file:path?params, adding the documented settings the DSN leaves out.
func parseSQLite(rest string) (target, error) {
	rest = strings.TrimPrefix(rest, "//")
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return target{}, usageErr("SQLite DSN needs a file: sqlite:path/to/app.db")
	}
	if path == ":memory:" || strings.Contains(query, "mode=memory") {
		return target{}, usageErr("an in-memory SQLite database lives only as long as this command; give a file: sqlite:path/to/app.db")
	}
	params := []string{}
	if query != "" {
		params = append(params, query)
	}
	for _, d := range sqliteDefaults {
		if !strings.Contains(query, d.match) {
			params = append(params, d.key+"="+d.value)
		}
	}
	return target{dialect: idem.SQLite, driver: "sqlite", dsn: "file:" + path + "?" + strings.Join(params, "&"),
		where: "sqlite file " + path, file: path}, nil
}

// dbFlags are the flags every database subcommand takes.
type dbFlags struct {
	dsn   string
	table string
}

// dsnUsage is the usage of the --dsn flag of the commands that need a
// database.
const dsnUsage = "database: postgres://..., mysql://user:pass@host:port/db, mariadb://..., tidb://..., sqlite:path or file:path (default $IDEM_DSN)"

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
func (f *dbFlags) open(ctx context.Context, create bool, opts ...idem.Option) (*sql.DB, target, *idem.Store, error) {
	dsn, err := dsnOrEnv(f.dsn)
	if err != nil {
		return nil, target{}, nil, err
	}
	t, err := parseDSN(ctx, dsn)
	if err != nil {
		return nil, t, nil, err
	}
	s, err := idem.New(t.dialect, append([]idem.Option{idem.WithTable(f.table)}, opts...)...)
	if err != nil {
		return nil, t, nil, usageErr("%v", err)
	}
	switch {
	case create:
		t = withWAL(t)
	case t.file != "":
		if _, err := os.Stat(t.file); err != nil {
			return nil, t, nil, usageErr("no SQLite database at %s: %v", t.file, errors.Unwrap(err))
		}
	}
	db, err := connect(ctx, t)
	return db, t, s, err
}

// connect opens t and pings it; any failure is exit code 2 with one line.
func connect(ctx context.Context, t target) (*sql.DB, error) {
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		return nil, usageErr("cannot open %s: %v", t.where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, usageErr("cannot connect to %s: %v", t.where, err)
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	return db, nil
}
