package idem

import (
	"database/sql"
	"strings"
	"testing"
)

type committer struct{ *sql.DB }

func (committer) Commit() error   { return nil }
func (committer) Rollback() error { return nil }

type bare struct{}

// notTx accepts what can end itself and refuses the rest, saying what it
// is and what to pass instead; the verdict is the type's, every time.
func TestNotTx(t *testing.T) {
	for name, c := range map[string]struct {
		h    any
		want []string // in the reason; none: accepted
	}{
		"*sql.Tx":              {(*sql.Tx)(nil), nil},
		"a type with Commit":   {committer{}, nil},
		"*sql.DB":              {(*sql.DB)(nil), []string{"got *sql.DB", "it has BeginTx", "db.BeginTx", "idem.RunTx"}},
		"*sql.Conn":            {(*sql.Conn)(nil), []string{"got *sql.Conn", "it has BeginTx"}},
		"embeds *sql.DB":       {struct{ *sql.DB }{}, []string{"it has BeginTx"}},
		"a type of its own":    {bare{}, []string{"got idem.bare", "no Commit and Rollback", "embedding *sql.Tx"}},
		"a pointer to its own": {&bare{}, []string{"got *idem.bare", "no Commit and Rollback"}},
	} {
		for range 2 {
			why := notTx(c.h)
			if (why == "") != (c.want == nil) {
				t.Fatalf("%s: notTx = %q, want refused: %v", name, why, c.want != nil)
			}
			for _, w := range c.want {
				if !strings.Contains(why, w) {
					t.Errorf("%s: notTx = %q, want it to say %q", name, why, w)
				}
			}
		}
	}
}
