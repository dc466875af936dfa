package idem

import "testing"

func TestMySQLInline(t *testing.T) {
	q := MySQL.inline(query{SQL: "UPDATE t SET a = ?, b = ?, c = ?, d = ? WHERE e = ? AND f = ?",
		Args: []any{"x'?\\", []byte{0, 0xff}, []byte(nil), []byte{}, int64(-7), 201}})
	if want := `UPDATE t SET a = X'78273f5c', b = X'00ff', c = NULL, d = X'' WHERE e = -7 AND f = 201`; q.SQL != want || q.Args != nil {
		t.Errorf("inline = %q, %v; want %q, nil", q.SQL, q.Args, want)
	}
	big := make([]byte, maxInline)
	for _, args := range [][]any{{big}, {1.5}, {"one", "two"}, {nil}} {
		got := MySQL.inline(query{SQL: "SELECT ?", Args: args})
		if got.SQL != "SELECT ?" || len(got.Args) != len(args) {
			t.Errorf("inline of %d args of types %T: %q, %d args; want the query and arguments unchanged", len(args), args[0], got.SQL, len(got.Args))
		}
	}
	in := query{SQL: "SELECT $1", Args: []any{"x"}}
	if got := Postgres.inline(in); got.SQL != in.SQL || len(got.Args) != 1 {
		t.Error("Postgres inlines: pgx caches a prepared statement per distinct text")
	}
}
