package idem

import (
	"strings"
	"testing"
)

func TestMySQLInline(t *testing.T) {
	q := myLiterals(Query{SQL: "UPDATE t SET a = ?, b = ?, c = ?, d = ?, k = ? WHERE e = ? AND f = ?",
		Args: []any{"x'?\\", []byte{0, 0xff}, []byte(nil), []byte{}, nil, int64(-7), 201}})
	if want := `UPDATE t SET a = X'78273f5c', b = X'00ff', c = NULL, d = X'', k = NULL WHERE e = -7 AND f = 201`; q.SQL != want || q.Args != nil {
		t.Errorf("inline = %q, %v; want %q, nil", q.SQL, q.Args, want)
	}
	big := make([]byte, maxInline)
	for _, args := range [][]any{{big}, {1.5}, {"one", "two"}} {
		got := myLiterals(Query{SQL: "SELECT ?", Args: args})
		if got.SQL != "SELECT ?" || len(got.Args) != len(args) {
			t.Errorf("inline of %d args of types %T: %q, %d args; want the query and arguments unchanged", len(args), args[0], got.SQL, len(got.Args))
		}
	}
}

// On lib/pq, Postgres writes the arguments as literals that mean the same
// bytes whatever standard_conforming_strings says; on any other handle
// (pgx, whose database/sql driver caches a prepared statement per
// distinct text) it leaves the parameters.
func TestPostgresInline(t *testing.T) {
	q := pgLiterals(Query{SQL: "UPDATE t SET a = $1, b = $2, c = $3, d = $4, k = $8::bigint WHERE e = $5 AND f = $6 AND g = $1 AND h = $7::bigint",
		Args: []any{`x'$\y`, []byte{0, 0xff}, []byte(nil), []byte{}, int64(-7), 201, 10, nil}})
	if want := `UPDATE t SET a = E'x''$\\y', b = E'\\x00ff'::bytea, c = NULL, d = E'\\x'::bytea, k = NULL::bigint WHERE e = (-7) AND f = 201 AND g = E'x''$\\y' AND h = 10::bigint`; q.SQL != want || q.Args != nil {
		t.Errorf("literals = %q, %v; want %q, nil", q.SQL, q.Args, want)
	}
	big := strings.Repeat("x", maxInline)
	// Too long, another type, NUL, invalid UTF-8, a character beyond
	// ASCII (whose bytes some client encodings read otherwise), a control
	// character.
	for _, args := range [][]any{{big}, {1.5}, {"a\x00b"}, {"\xff"}, {"Á\\'"}, {"tab\there"}} {
		got := pgLiterals(Query{SQL: "SELECT $1", Args: args})
		if got.SQL != "SELECT $1" || len(got.Args) != len(args) {
			t.Errorf("literals of %T %q: %q, %d args; want the query and arguments unchanged", args[0], args[0], got.SQL, len(got.Args))
		}
	}
	for _, sql := range []string{"SELECT $2", "SELECT $0", "SELECT $"} {
		if got := pgLiterals(Query{SQL: sql, Args: []any{"x"}}); got.SQL != sql || len(got.Args) != 1 {
			t.Errorf("literals of %q with one argument: %q; want it unchanged", sql, got.SQL)
		}
	}
	if Postgres.literals(sqlConn{}) != nil || Postgres.literals(&countingConn{}) != nil {
		t.Error("Postgres writes literals on a handle that is not lib/pq's")
	}
	if MySQL.literals(&countingConn{}) != nil || MySQL.literals(sqlConn{}) == nil {
		t.Error("MySQL writes literals on a handle that is not database/sql's, or not on one that is")
	}
}
