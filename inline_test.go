package idem

import "testing"

func TestMySQLInline(t *testing.T) {
	in := MySQL.(inliner)
	q, args := in.inline("UPDATE t SET a = ?, b = ?, c = ?, d = ? WHERE e = ? AND f = ?",
		[]any{"x'?\\", []byte{0, 0xff}, []byte(nil), []byte{}, int64(-7), 201})
	if want := `UPDATE t SET a = X'78273f5c', b = X'00ff', c = NULL, d = X'' WHERE e = -7 AND f = 201`; q != want || args != nil {
		t.Errorf("inline = %q, %v; want %q, nil", q, args, want)
	}
	big := make([]byte, maxInline)
	for _, args := range [][]any{{big}, {1.5}, {"one", "two"}} {
		q, got := in.inline("SELECT ?", args)
		if q != "SELECT ?" || len(got) != len(args) {
			t.Errorf("inline of %d args of types %T: %q, %d args; want the query and arguments unchanged", len(args), args[0], q, len(got))
		}
	}
	if _, ok := Postgres.(inliner); ok {
		t.Error("Postgres inlines: pgx caches a prepared statement per distinct text")
	}
}
