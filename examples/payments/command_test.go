package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// build builds the service's binary into a directory of the test's own.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "payments")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The service as its README runs it: -h prints each default once; a
// database it cannot reach is an error before anything says "listening";
// once it says "listening", its tables are there and it answers.
func TestCommandLine(t *testing.T) {
	bin := build(t)

	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, def := range []string{"127.0.0.1:8080", "sqlite:payments.db", "$PAYMENTS_DSN", "10s"} {
		if n := strings.Count(string(out), def); n != 1 {
			t.Errorf("-h shows %q %d times, want once:\n%s", def, n, out)
		}
	}
	for _, usage := range strings.Split(string(out), "\n  -")[1:] {
		if n := strings.Count(usage, "default"); n > 1 {
			t.Errorf("-h gives the flag -%s %d defaults, want one", usage, n)
		}
	}
	for _, form := range []string{"postgres://", "mysql://", "mariadb://", "tidb://", "sqlite:", "file:"} {
		if !strings.Contains(string(out), form) {
			t.Errorf("-h does not name the DSN form %s:\n%s", form, out)
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	for _, dsn := range []string{"mariadb://root@" + closed + "/test", "tidb://root@" + closed + "/test", "postgres://postgres@" + closed + "/test?sslmode=disable"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, bin, "-dsn", dsn, "-addr", "127.0.0.1:0").CombinedOutput()
		cancel()
		if err == nil || strings.Contains(string(out), "listening") || !strings.Contains(string(out), "cannot connect to") {
			t.Errorf("-dsn %s, which nothing answers: %v; want an error that it cannot connect, and no \"listening\":\n%s", dsn, err, out)
		}
	}

	db := filepath.Join(t.TempDir(), "payments.db")
	cmd := exec.Command(bin, "-dsn", "sqlite:"+db, "-addr", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	if !lines.Scan() || !strings.Contains(lines.Text(), "msg=listening") {
		t.Fatalf("first log line %q, want listening", lines.Text())
	}
	conn, err := sql.Open("sqlite", "file:"+db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var tables int
	if err := conn.QueryRow("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('charges', 'idempotency_keys')").Scan(&tables); err != nil || tables != 2 {
		t.Errorf("once the service is listening, %d of its 2 tables exist (%v)", tables, err)
	}
	addr := strings.TrimPrefix(lines.Text()[strings.Index(lines.Text(), "addr=")+len("addr="):], "http://")
	a, err := send("GET", fmt.Sprintf("http://%s/v1/charges/ch_none", addr), "", "")
	if err != nil || a.status != 404 {
		t.Errorf("GET of a missing charge: %d %s %v; want 404", a.status, a.body, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("the service stopped by SIGTERM: %v, want exit 0", err)
	}
}
