// Package dburl reads the database URLs that the idem command and the
// examples take (postgres://, postgresql://, mysql://, mariadb://,
// tidb://, sqlite: and file:) into a dialect, a database/sql driver and a
// DSN in that driver's own format, and registers the drivers it names.
// Its errors never quote a URL or any part of one but its scheme: a URL
// may hold a password. docs/cli.md describes the forms.
package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the driver of postgres:// URLs
	_ "modernc.org/sqlite"             // the driver of sqlite: and file: URLs

	"github.com/idemkit/idem"
)

// Forms lists the forms Parse reads, for a flag's usage text.
const Forms = "postgres://..., mysql://user:pass@host:port/db, mariadb://..., tidb://..., sqlite:path or file:path"

// Target is a parsed database URL.
type Target struct {
	Dialect idem.Dialect
	Driver  string // the database/sql driver: pgx, mysql or sqlite
	DSN     string // in the driver's own format
	Where   string // for messages: the dialect and host:port, or the file; never a password
	File    string // SQLite: the database file; "" for a server
}

// sqliteDefaults are connection settings the SQLite dialect documents;
// Parse adds each one the URL does not set itself. journal_mode is not
// among them: it changes the file for good, so only a program that
// creates the database sets it ([Target.WithWAL]).
var sqliteDefaults = []struct{ key, match, value string }{
	{"_txlock", "_txlock=", "immediate"},
	{"_pragma", "busy_timeout", "busy_timeout(10000)"},
}

// Parse reads postgres://, postgresql://, mysql://, mariadb://, tidb://,
// sqlite: and file: URLs, the scheme in any case.
func Parse(dsn string) (Target, error) {
	scheme, rest, ok := strings.Cut(dsn, ":")
	if !ok || !validScheme(scheme) {
		return Target{}, errors.New(noScheme(dsn))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := parseURL(dsn, "Postgres")
		if err != nil {
			return Target{}, err
		}
		// pgx recognises only the lower-case schemes and reads anything
		// else as key=value settings, quoting the whole DSN in its error.
		return Target{Dialect: idem.Postgres, Driver: "pgx", DSN: "postgres" + dsn[len(scheme):],
			Where: "postgres at " + hostOr(u.Host, "localhost:5432")}, nil
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
		return Target{}, errors.New(noScheme(dsn))
	}
	return Target{}, fmt.Errorf("unknown DSN scheme %q; use postgres://, postgresql://, mysql://, mariadb://, tidb://, sqlite: or file:", scheme)
}

// WithWAL adds journal_mode(WAL) to a SQLite target whose URL does not set
// a journal mode, for a program that creates the database; any other
// target it returns as it is.
func (t Target) WithWAL() Target {
	if t.File != "" && !strings.Contains(t.DSN, "journal_mode") {
		t.DSN += "&_pragma=journal_mode(WAL)"
	}
	return t
}

// Open opens t and checks, within ten seconds, that the database answers.
func (t Target) Open(ctx context.Context) (*sql.DB, error) {
	db, err := sql.Open(t.Driver, t.DSN)
	if err != nil {
		return nil, fmt.Errorf("cannot open %s: %w", t.Where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot connect to %s: %w", t.Where, err)
	}
	return db, nil
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
	const forms = "use postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db, mariadb://..., tidb://..., sqlite:path or file:path"
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
		return nil, fmt.Errorf("the %s DSN (not shown: it may hold a password) is not a valid URL; percent-encode the user name and password (%%40 for @, %%3A for :, %%2F for /, %%3F for ?, %%23 for #, %%25 for %%, %%20 for a space)", name)
	}
	if _, after, _ := strings.Cut(dsn, "://"); strings.Count(after, "@") > 1 ||
		strings.Contains(after[strings.IndexAny(after+"/", "/?#"):], "@") {
		// A raw '/', '?' or '#' in the password ends the host part early,
		// and drivers split a raw '@' differently (pgx at the first, like
		// libpq; net/url at the last): a driver would take a piece of the
		// password for the host (and look it up in DNS) or the database.
		return nil, fmt.Errorf("the %s DSN (not shown: it may hold a password) has more than one '@' or one after its host; percent-encode '@', '/', '?' and '#' in the user name and password (%%40, %%2F, %%3F, %%23)", name)
	}
	return u, nil
}

func hostOr(h, def string) string {
	if h == "" {
		return def
	}
	return h
}

// parseMySQL turns mysql://user:pass@host:port/db?params (or mariadb://,
// tidb://) into go-sql-driver's user:pass@tcp(host:port)/db?params, for
// dialect d, whose server listens on port by default.
func parseMySQL(dsn string, d idem.Dialect, port string) (Target, error) {
	name := map[idem.Dialect]string{idem.MySQL: "MySQL", idem.MariaDB: "MariaDB", idem.TiDB: "TiDB"}[d]
	u, err := parseURL(dsn, name)
	if err != nil {
		return Target{}, err
	}
	if u.Host == "" {
		return Target{}, fmt.Errorf("%s DSN needs a host: %s://user:pass@host:%s/db", name, d.Name(), port)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), port)
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
	if err != nil {
		return Target{}, fmt.Errorf("bad %s DSN parameters: %v", name, err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return Target{Dialect: d, Driver: "mysql", DSN: cfg.FormatDSN(), Where: d.Name() + " at " + host}, nil
}

// parseSQLite turns sqlite:path or file:path into modernc.org/sqlite's
// file:path?params, adding the documented settings the DSN leaves out.
func parseSQLite(rest string) (Target, error) {
	rest = strings.TrimPrefix(rest, "//")
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return Target{}, errors.New("SQLite DSN needs a file: sqlite:path/to/app.db")
	}
	if path == ":memory:" || strings.Contains(query, "mode=memory") {
		return Target{}, errors.New("an in-memory SQLite database lives only as long as the process that opens it; give a file: sqlite:path/to/app.db")
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
	return Target{Dialect: idem.SQLite, Driver: "sqlite", DSN: "file:" + path + "?" + strings.Join(params, "&"),
		Where: "sqlite file " + path, File: path}, nil
}
