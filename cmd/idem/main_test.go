package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The command's tests here need no database server: they run on SQLite.
// Its tests on every server are in the module integration_test
// (command_test.go), against the same binary.

// bin is the idem binary, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "idem")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func idemCmd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "IDEM_DSN=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("idem %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// scenarioRows are the rows of the demo's closing table.
func scenarioRows(t *testing.T, out string) []string {
	t.Helper()
	_, table, ok := strings.Cut(out, "\nSCENARIO ")
	if !ok {
		t.Fatalf("no closing table in the demo's output:\n%s", out)
	}
	header, table, _ := strings.Cut(table, "\n")
	for _, col := range []string{"WITH IDEM", "NAIVE CACHE", "IDEM OK"} {
		if !strings.Contains(header, col) {
			t.Errorf("table header %q lacks %q", header, col)
		}
	}
	rows, _, _ := strings.Cut(table, "\n\n")
	return strings.Split(rows, "\n")
}

// naiveCharges reads the naive column of a row of the demo's table.
var naiveCharges = regexp.MustCompile(` (\d+) charges +yes$`)

// The newcomer's first command: exit code 0, and a table that shows one
// charge with idem and more without, for every scenario; each scenario
// says what in idem held; every line fits 80 columns. On SQLite, the
// demo's default database.
func TestDemo(t *testing.T) {
	testDemo(t, idemCmd(t, "demo"), 16)
	t.Run("burst 2", func(t *testing.T) { testDemo(t, idemCmd(t, "demo", "--burst", "2"), 2) })
}

// testDemo checks the output of a demo of burst concurrent retries.
func testDemo(t *testing.T, r result, burst int) {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit code %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	rows := scenarioRows(t, r.stdout)
	if len(rows) != len((&demo{}).scenarios()) {
		t.Fatalf("%d rows in the table, want one per scenario:\n%s", len(rows), r.stdout)
	}
	for _, row := range rows {
		if !strings.HasSuffix(row, " yes") || strings.Count(row, "1 charge") < 1 {
			t.Errorf("row %q: want one charge with idem and IDEM OK yes", row)
		}
		// The naive column is measured: expect duplicates (or the
		// wrong receipt), not an exact number.
		if m := naiveCharges.FindStringSubmatch(row); m != nil {
			if n, _ := strconv.Atoi(m[1]); n < 2 {
				t.Errorf("row %q: the naive cache charged %d times", row, n)
			}
		} else if !strings.Contains(row, "wrong receipt") {
			t.Errorf("row %q: no naive outcome", row)
		}
	}
	if want := fmt.Sprintf("1 charge, %s ", plural(burst-1, "replay")); !strings.HasPrefix(rows[0], fmt.Sprintf("burst: %d concurrent retries", burst)) || !strings.Contains(rows[0], want) {
		t.Errorf("burst row %q: want %q", rows[0], want)
	}
	lines := strings.Split(r.stdout, "\n")
	progress := 0
	for i, line := range lines {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns wide, more than 80: %q", i+1, n, line)
		}
		if strings.Contains(line, "] ") {
			progress++
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "      held by ") {
				t.Errorf("progress line %q is not followed by what held", line)
			}
		}
		if regexp.MustCompile(`\b1 [a-z]+s\b`).MatchString(line) {
			t.Errorf("line %q: a plural after 1", line)
		}
	}
	if progress != len(rows) {
		t.Errorf("want one progress line per scenario:\n%s", r.stdout)
	}
}

// Bad input is one line on stderr and exit code 2, never a stack trace.
func TestBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.db")
	cases := map[string][]string{
		"unknown scheme":      {"stats", "--dsn", "oracle://scott@tiger/db"},
		"no scheme":           {"stats", "--dsn", "host=127.0.0.1 user=postgres password=wrong-password"},
		"no dsn":              {"stats"},
		"unreachable server":  {"stats", "--dsn", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"},
		"unreachable mysql":   {"stats", "--dsn", "mysql://root@127.0.0.1:1/test"},
		"missing sqlite":      {"inspect", "--dsn", "sqlite:" + missing, "--key", "k"},
		"in-memory sqlite":    {"migrate", "--dsn", "sqlite::memory:"},
		"bad table":           {"migrate", "--dsn", "sqlite:" + missing, "--table", "x; DROP TABLE y"},
		"unknown command":     {"frobnicate"},
		"bad batch":           {"purge", "--dsn", "sqlite:" + missing, "--batch", "0"},
		"bad workers":         {"purge", "--dsn", "sqlite:" + missing, "--workers", "0"},
		"inspect without key": {"inspect", "--dsn", "sqlite:" + missing},
		"stray argument":      {"stats", "extra"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			r := idemCmd(t, args...)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "idem: ") || strings.Contains(r.stderr, "goroutine") {
				t.Errorf("exit %d, stderr %q; want exit 2 and one line", r.code, r.stderr)
			}
			if strings.Contains(r.stderr, "wrong-password") {
				t.Errorf("stderr shows the password: %q", r.stderr)
			}
		})
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("a failed command left %s behind", missing)
	}
}

// Every subcommand answers --help with its usage and exit code 0.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		r := idemCmd(t, c.name, "--help")
		if r.code != 0 || !strings.Contains(r.stderr, "Usage: idem "+c.name) {
			t.Errorf("%s --help: exit %d, stderr %q", c.name, r.code, r.stderr)
		}
	}
	r := idemCmd(t, "help")
	for _, c := range commands {
		if r.code != 0 || !strings.Contains(r.stdout, c.name) {
			t.Errorf("help: exit %d, lacks %s:\n%s", r.code, c.name, r.stdout)
		}
	}
}
