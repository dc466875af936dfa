package main

import "testing"

// idem bench refuses bad flags with exit code 2. It runs on every
// database in the module integration_test (TestCommandBench).
func TestBenchRefusesBadFlags(t *testing.T) {
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
