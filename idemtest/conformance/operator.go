package conformance

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// The reads and messages an operator meets (the idem command's inspect,
// stats, purge and migrate): InspectKey, which finds a key without its
// scope, and what the methods say of a table that does not exist, is not
// idem's, or names a schema that does not exist.

// InspectKey finds a key in every scope that has it, in the order of the
// scopes' bytes (no case folding, no pad-space), each record as Inspect
// reads it; limit bounds how many; a key compares byte for byte.
func testInspectKeyAcrossScopes(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		s := e.store()
		scopes := []string{"b", "a ", "B", "a", ""} // in byte order: "", "B", "a", "a ", "b"
		for _, scope := range scopes {
			req := charge("k-1", "1")
			req.Scope = scope
			must(t, e.doOK(s, req))
		}
		claimed := charge("k-1", "1")
		claimed.Scope = "c"
		if _, _, err := s.Begin(ctx, e.db, claimed); err != nil {
			t.Fatal(err)
		}
		must(t, e.doOK(s, charge("k-2", "1")))
		must(t, e.doOK(s, charge("K-1", "1")))

		recs, err := s.InspectKey(ctx, e.db, "k-1", 10)
		must(t, err)
		var got []string
		for _, r := range recs {
			got = append(got, r.Scope)
		}
		if want := []string{"", "B", "a", "a ", "b", "c"}; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("InspectKey(k-1) found the scopes %q, want %q", got, want)
		}
		for _, r := range recs {
			one, err := s.Inspect(ctx, e.db, r.Scope, "k-1")
			must(t, err)
			if one == nil || r.Key != "k-1" || r.Status != one.Status || r.Token != one.Token || r.Operation != one.Operation ||
				r.Fingerprint != one.Fingerprint || !r.CreatedAt.Equal(one.CreatedAt) || !r.LeaseUntil.Equal(one.LeaseUntil) ||
				!r.CompletedAt.Equal(one.CompletedAt) || r.Forgotten != one.Forgotten || (r.Response == nil) != (one.Response == nil) ||
				r.Now.IsZero() {
				t.Errorf("InspectKey's record of scope %q: %+v; Inspect reads %+v", r.Scope, r, one)
			}
			if want := idem.StatusCompleted; r.Scope == "c" {
				if r.Status != idem.StatusProcessing || r.Response != nil {
					t.Errorf("scope c holds a claim: %+v", r)
				}
			} else if r.Status != want || r.Response == nil || r.Response.StatusCode != 200 {
				t.Errorf("scope %q holds a completed record: %+v", r.Scope, r)
			}
		}

		recs, err = s.InspectKey(ctx, e.db, "k-1", 2)
		must(t, err)
		if len(recs) != 2 || recs[0].Scope != "" || recs[1].Scope != "B" {
			t.Errorf("InspectKey(k-1, limit 2): %+v, want the scopes \"\" and \"B\"", recs)
		}
		recs, err = s.InspectKey(ctx, e.db, "K-2", 10)
		must(t, err)
		if len(recs) != 0 {
			t.Errorf("InspectKey(K-2): %+v; keys compare byte for byte, and k-2 is another key", recs)
		}
		if _, err := s.InspectKey(ctx, e.db, "bad key", 10); !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("InspectKey of an invalid key: %v, want ErrInvalidKey", err)
		}
		if _, err := s.InspectKey(ctx, e.db, "k-1", 0); err == nil || !strings.Contains(err.Error(), "limit") {
			t.Errorf("InspectKey with limit 0: %v, want an error about the limit", err)
		}
	})
}

// A table that does not exist, one that is not idem's (a name of the
// application's own table) and one in a schema that does not exist: each
// method says which it is and what to do, never to run it again, and
// Migrate changes nothing in a table that is not idem's.
func testSchemaFaultsSayWhatToDo(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		on := func(table string) *store {
			is, err := idem.New(e.Dialect, idem.WithTable(table))
			must(t, err)
			return e.onDriver(is)
		}
		check := func(what string, err error, want ...string) {
			t.Helper()
			if err == nil {
				t.Errorf("%s: no error", what)
				return
			}
			for _, w := range want {
				if !strings.Contains(told(err), w) {
					t.Errorf("%s: %q does not say %q", what, told(err), w)
				}
			}
			for _, bad := range []string{"run it again", "run Purge again", "may create and alter", "may read"} {
				if strings.Contains(told(err), bad) {
					t.Errorf("%s: %q says %q", what, told(err), bad)
				}
			}
		}
		reads := func(s *store, want ...string) {
			t.Helper()
			_, err := s.Inspect(ctx, e.db, "tenant-1", "k")
			check("Inspect", err, want...)
			_, err = s.InspectKey(ctx, e.db, "k", 10)
			check("InspectKey", err, want...)
			_, err = s.Stats(ctx, e.db)
			check("Stats", err, want...)
			_, err = s.PurgeBatch(ctx, e.db, 10)
			check("PurgeBatch", err, want...)
			_, err = s.Purge(ctx, e.db, 10)
			check("Purge", err, want...)
		}

		missing := randName("missing")
		reads(on(missing), "table "+missing+" does not exist", "idem migrate --table "+missing)

		biz := e.business()
		if e.CommentSQL != nil {
			e.exec(e.CommentSQL(biz, "the application''s"))
		}
		before := e.layout(biz)
		foreign := on(biz)
		reads(foreign, "table "+biz+" is not idem's", "will not help")
		check("Migrate", foreign.Migrate(ctx, e.db), "table "+biz+" is not idem's", "Migrate changed nothing")
		if after := e.layout(biz); after != before {
			t.Errorf("Migrate on a table that is not idem's changed it (its comment, settings, columns or indexes):\nbefore: %s\nafter:  %s", before, after)
		}
		if n := e.count(biz, "k"); n != 0 {
			t.Errorf("the application's table holds %d rows with k = 'k', want 0", n)
		}

		nowhere := randName("nosuchschema") + ".keys"
		check("Migrate", on(nowhere).Migrate(ctx, e.db), "the schema of table "+nowhere+" does not exist", "create it first")
	})
}
