package main

import (
	"strings"
	"testing"
)

// idem bench runs every path, the floors and both storms on every database, briefly,
// and refuses bad flags with exit code 2.
func TestBench(t *testing.T) {
	for name, dsn := range databases(t) {
		t.Run(name, func(t *testing.T) {
			r := idemCmd(t, "bench", "--dsn", dsn, "--rounds", "1", "--duration", "30ms", "--concurrency", "2", "--hot", "2", "--storms", "1")
			if r.code != 0 {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			for _, want := range []string{"bare ", "floor ", "fresh ", "read ", "replay ", "claim ", "hot ", "ratio to floor", "tx ", "claim, poll 20ms ", "Each ratio is the median over 1 round of the ratio of paired runs"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, r.stdout)
				}
			}
		})
	}
	for _, args := range [][]string{
		{"--dsn", "sqlite:x.db", "--concurrency", "0"},
		{"--dsn", "sqlite:x.db", "--driver", "pgx"},
		{"--dsn", "sqlite:x.db", "--rounds", "0"},
		{"--dsn", "sqlite:x.db", "--hot", "0"},
		{"--driver", "pgx"},
	} {
		if r := idemCmd(t, append([]string{"bench"}, args...)...); r.code != 2 {
			t.Errorf("bench %q: exit %d, want 2; stderr %q", args, r.code, r.stderr)
		}
	}
}
