package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"

	"github.com/idemkit/idem"
)

// table makes a migrated Store on a table of its own on db, dropped when
// t ends, for a measurement.
func table(t *testing.T, db *sql.DB, d idem.Dialect, opts ...idem.Option) *idem.Store {
	t.Helper()
	tag := make([]byte, 6)
	_, _ = rand.Read(tag)
	s, err := idem.New(d, append([]idem.Option{idem.WithTable("idem_measure_" + hex.EncodeToString(tag))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + s.Table()); err != nil {
			t.Errorf("drop %s: %v", s.Table(), err)
		}
	})
	return s
}

// exec runs a statement of a measurement, failing t on an error.
func exec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// int64Of runs a query of a measurement that returns one integer.
func int64Of(t *testing.T, db *sql.DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
