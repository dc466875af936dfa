package idem

import (
	"reflect"
	"testing"
)

// TestStatementsOfRoundTrip checks that SQLite's statements, read back
// as a caller's and built again as NewDialect builds a caller's, are
// SQLite's own: no field of Statements is lost on the way.
func TestStatementsOfRoundTrip(t *testing.T) {
	for _, parts := range [][]string{{DefaultTable}, {"main", "keys"}} {
		pub, err := StatementsOf(SQLite, parts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := internalStatements(pub, parts), SQLite.statements(parts); !reflect.DeepEqual(got, want) {
			t.Errorf("%v: built again\n%+v\nwant\n%+v", parts, got, want)
		}
	}
}
