package integration_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/conformance"
)

// TestOutsideDialect runs the public conformance suite on SQLite through a
// dialect built as a caller outside idem builds one: NewDialect, SQLite's
// statements read back with StatementsOf, and error readers of its own.
// It proves that what a DialectSpec can hold is enough for every
// behaviour test.
func TestOutsideDialect(t *testing.T) {
	sqliteDir = t.TempDir()
	d, err := idem.NewDialect(idem.DialectSpec{
		Name: "sqlite-outside",
		Statements: func(table []string) idem.Statements {
			st, err := idem.StatementsOf(idem.SQLite, table)
			if err != nil {
				panic(err) // idem gives only valid names
			}
			return st
		},
		Inserted:  func(n int64, err error) (bool, error) { return n == 1, err },
		Retryable: idem.IsRetryable,
		Applied:   func(err error) bool { return strings.Contains(err.Error(), "duplicate column name") },
		SchemaFault: func(err error) idem.SchemaFault {
			switch msg := err.Error(); {
			case strings.Contains(msg, "no such table: "):
				return idem.NoTable
			case strings.Contains(msg, "no such column: "), strings.Contains(msg, " has no column named "):
				for _, c := range []string{"expires_at", "sealed_key", "forget_at", "result_ref"} {
					if strings.Contains(msg, c) {
						return idem.OlderTable
					}
				}
				return idem.NotIdemTable
			case strings.Contains(msg, "unknown database "):
				return idem.NoSchema
			}
			return idem.NoSchemaFault
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tg := sqliteTarget()
	tg.Name = "sqlite-outside"
	tg.Dialect = d
	tg.DSN = func(testing.TB) string { return "file:" + filepath.Join(sqliteDir, "outside.db") + sqliteParams }
	conformance.Exercise(t, tg)
}
