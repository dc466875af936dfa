package dburl

import (
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// Each form reaches its driver in the driver's own format, with its
// dialect; an upper-case scheme reaches pgx in the form it recognises, so
// it connects where the URL says instead of to the local socket.
func TestParse(t *testing.T) {
	for in, want := range map[string]struct {
		dialect idem.Dialect
		driver  string
		dsn     string // a prefix of the driver's DSN
		where   string
	}{
		"postgres://u:p@h:5432/db?sslmode=disable": {idem.Postgres, "pgx", "postgres://u:p@h:5432/db?sslmode=disable", "postgres at h:5432"},
		"POSTGRES://u:p@h:1/db?x=y":                {idem.Postgres, "pgx", "postgres://u:p@h:1/db?x=y", "postgres at h:1"},
		"PostgreSQL://u:p@h:1/db?x=y":              {idem.Postgres, "pgx", "postgres://u:p@h:1/db?x=y", "postgres at h:1"},
		"mysql://root:secret@127.0.0.1:3306/test":  {idem.MySQL, "mysql", "root:secret@tcp(127.0.0.1:3306)/test", "mysql at 127.0.0.1:3306"},
		"MySQL://u:p@h:1/db":                       {idem.MySQL, "mysql", "u:p@tcp(h:1)/db", "mysql at h:1"},
		"mariadb://u:p@h/db":                       {idem.MariaDB, "mysql", "u:p@tcp(h:3306)/db", "mariadb at h:3306"},
		"MariaDB://u:p@h/db":                       {idem.MariaDB, "mysql", "u:p@tcp(h:3306)/db", "mariadb at h:3306"},
		"tidb://root@h/test":                       {idem.TiDB, "mysql", "root@tcp(h:4000)/test", "tidb at h:4000"},
		"TiDB://u:p@h/db":                          {idem.TiDB, "mysql", "u:p@tcp(h:4000)/db", "tidb at h:4000"},
		"sqlite:data/payments.db":                  {idem.SQLite, "sqlite", "file:data/payments.db?_txlock=immediate&_pragma=busy_timeout(10000)", "sqlite file data/payments.db"},
		"SQLITE:app.db":                            {idem.SQLite, "sqlite", "file:app.db?", "sqlite file app.db"},
		"File:app.db?_txlock=deferred":             {idem.SQLite, "sqlite", "file:app.db?_txlock=deferred&_pragma=busy_timeout(10000)", "sqlite file app.db"},
	} {
		got, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if got.Dialect != want.dialect || got.Driver != want.driver || !strings.HasPrefix(got.DSN, want.dsn) || got.Where != want.where {
			t.Errorf("Parse(%q) = %s %s %q %q; want %s %s %q... %q", in, got.Dialect.Name(), got.Driver, got.DSN, got.Where,
				want.dialect.Name(), want.driver, want.dsn, want.where)
		}
	}
}

// WithWAL sets the journal mode of a SQLite file unless the URL does, and
// leaves a server's DSN alone.
func TestWithWAL(t *testing.T) {
	for in, want := range map[string]string{
		"sqlite:a.db": "file:a.db?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)",
		"sqlite:a.db?_pragma=journal_mode(DELETE)": "file:a.db?_pragma=journal_mode(DELETE)&_txlock=immediate&_pragma=busy_timeout(10000)",
		"mysql://u@h/db": "u@tcp(h:3306)/db",
	} {
		tg, err := Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := tg.WithWAL().DSN; got != want {
			t.Errorf("Parse(%q).WithWAL().DSN = %q, want %q", in, got, want)
		}
	}
}

// What is not a URL of a known form is refused, and the message quotes
// no part of it but a well-formed scheme.
func TestParseRefuses(t *testing.T) {
	for _, bad := range []string{
		"", "root:s3cret@tcp(h:3306)/db", "mysql://", "tidb:///db", "sqlite:", "sqlite::memory:", "sqlite:x.db?mode=memory",
		"oracle://h/db", "host=h password=s3cret", "postgres://u:s3cr/et@h/db", "mysql://u:s3c@ret@h/db",
	} {
		_, err := Parse(bad)
		if err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
			continue
		}
		if strings.Contains(err.Error(), "s3c") {
			t.Errorf("Parse(%q): %v; the message shows the password", bad, err)
		}
	}
}
