package idem

import "testing"

func TestMySQLInline(t *testing.T) {
	q := MySQL.inline(query{"UPDATE t SET a = ?, b = ?, c = ?, d = ? WHERE e = ? AND f = ?",
		[]any{"x'?\\", []byte{0, 0xff}, []byte(nil), []byte{}, int64(-7), 201}})
	if want := `UPDATE t SET a = X'78273f5c', b = X'00ff', c = NULL, d = X'' WHERE e = -7 AND f = 201`; q.sql != want || q.args != nil {
		t.Errorf("inline = %q, %v; want %q, nil", q.sql, q.args, want)
	}
	big := make([]byte, maxInline)
	for _, args := range [][]any{{big}, {1.5}, {"one", "two"}, {nil}} {
		got := MySQL.inline(query{"SELECT ?", args})
		if got.sql != "SELECT ?" || len(got.args) != len(args) {
			t.Errorf("inline of %d args of types %T: %q, %d args; want the query and arguments unchanged", len(args), args[0], got.sql, len(got.args))
		}
	}
	in := query{"SELECT $1", []any{"x"}}
	if got := Postgres.inline(in); got.sql != in.sql || len(got.args) != 1 {
		t.Error("Postgres inlines: pgx caches a prepared statement per distinct text")
	}
}
