package main

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A keys file's error names its line, for each command that reads one,
// and never shows a key; exit code 2, before any database is opened.
func TestKeysFileErrors(t *testing.T) {
	dir := t.TempDir()
	good, short := strings.Repeat("ab", 32), base64.StdEncoding.EncodeToString([]byte("sixteen-byte-key"))
	dsn := "sqlite:" + filepath.Join(dir, "absent.db")
	for name, c := range map[string]struct{ file, want string }{
		"wrong length": {"# keys\nk1 " + good + "\nk2 " + short + "\n", `line 3: the key of "k2" is 16 bytes`},
		"duplicate":    {"k1 " + good + "\n\nk1 " + good + "\n", `line 3: key ID "k1" given twice (first on line 1)`},
		"bad line":     {"k1 " + good + " " + short + "\n", "line 1: want a key ID and a key"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"reseal", "--dsn", dsn, "--keys-file", path},
			{"inspect", "--dsn", dsn, "--key", "k", "--keys-file", path},
		} {
			r := idemCmd(t, args...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, good) || strings.Contains(r.stderr, short) {
				t.Errorf("%s: %s: exit %d, stderr %q; want 2 and %q, no key", name, args[0], r.code, r.stderr, c.want)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "absent.db")); err == nil {
		t.Error("a refused keys file left a database behind")
	}
}
