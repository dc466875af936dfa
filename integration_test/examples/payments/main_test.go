// Package payments_test runs the payments example's binary on each
// server package testdb finds, in a database of its own there, as its
// README runs it. Its tests in examples/payments run it in process on
// SQLite, where they also steer its fake provider.
package payments_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
	"github.com/idemkit/idem/integration_test/internal/cmdtest"
)

func TestMain(m *testing.M) { cmdtest.Main(m) }

// servers are the servers the service runs on, by the scheme of its DSN.
var servers = []struct {
	scheme  string
	server  *testdb.Server
	dialect idem.Dialect
}{
	{"postgres", testdb.Postgres, idem.Postgres},
	{"mysql", testdb.MySQL, idem.MySQL},
	{"mariadb", testdb.MariaDB, idem.MariaDB},
	{"tidb", testdb.TiDB, idem.TiDB},
}

// On every server: a charge and its replay, duplicates that arrive while
// the slow provider runs (409s with Retry-After, then the replay), a
// decline stored and replayed, and a client that gives up and then gets
// its charge replayed; one row per charge, each with its own provider
// reference.
func TestPayments(t *testing.T) {
	for _, s := range servers {
		t.Run(s.scheme, func(t *testing.T) {
			t.Parallel()
			d := idemtest.ServerDatabase(t, s.server, s.dialect)
			url := start(t, cmdtest.DSN(t, s.scheme, s.server, d.DSN), "-provider-delay", "400ms")
			const body = `{"amount": 1999, "currency": "EUR", "card": "4242424242424242"}`

			first, again := post(t, url, "order-1", body), post(t, url, "order-1", body)
			if first.status != 201 || again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("charge and retry: %d %s / %d %s", first.status, first.body, again.status, again.body)
			}
			var c struct {
				ID, Status string
			}
			if err := json.Unmarshal(first.body, &c); err != nil || c.Status != "succeeded" || again.header.Get("Location") != "/v1/charges/"+c.ID {
				t.Fatalf("charge %s (Location %q): %v", first.body, again.header.Get("Location"), err)
			}
			if got := send(t, http.DefaultClient, "GET", url+"/v1/charges/"+c.ID, "", ""); got.status != 200 || !bytes.Contains(got.body, []byte(c.ID)) {
				t.Fatalf("GET: %d %s", got.status, got.body)
			}

			var (
				wg      sync.WaitGroup
				answers [5]answer
				saw409  [5]bool
			)
			for i := range answers {
				wg.Go(func() {
					for range 20 {
						a := send(t, http.DefaultClient, "POST", url+"/v1/charges", "order-2", body)
						if answers[i] = a; a.status != http.StatusConflict {
							return
						}
						saw409[i] = true
						secs, _ := strconv.Atoi(a.header.Get("Retry-After"))
						time.Sleep(time.Duration(secs) * time.Second)
					}
				})
			}
			wg.Wait()
			for _, a := range answers {
				if a.status != 201 || !bytes.Equal(a.body, answers[0].body) {
					t.Fatalf("duplicate: %d %s, first %d %s", a.status, a.body, answers[0].status, answers[0].body)
				}
			}
			if saw409 == [5]bool{} {
				t.Error("no duplicate saw a 409 while the provider call ran")
			}

			declined := strings.Replace(body, "4242424242424242", "4000000000000002", 1)
			for i := range 2 {
				if a := post(t, url, "order-3", declined); a.status != 402 || (a.header.Get("Idempotent-Replayed") == "true") != (i == 1) {
					t.Fatalf("declined card, request %d: %d %s", i, a.status, a.body)
				}
			}

			req, err := http.NewRequest("POST", url+"/v1/charges", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer sk_test_alice")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "impatient-1")
			if _, err := (&http.Client{Timeout: 100 * time.Millisecond}).Do(req); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the impatient attempt: %v, want its own timeout", err)
			}
			var last answer
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				if last = post(t, url, "impatient-1", body); last.status != http.StatusConflict || time.Now().After(deadline) {
					break
				}
			}
			if last.status != 201 || last.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the retry after the client gave up: %d %s %v; want the replay of the charge its first attempt started", last.status, last.body, last.header)
			}

			db, err := sql.Open(s.server.Driver, d.DSN)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var rows, refs int
			if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT provider_ref) FROM charges").Scan(&rows, &refs); err != nil {
				t.Fatal(err)
			}
			if rows != 4 || refs != 4 {
				t.Fatalf("%d charges with %d provider references, want 4 and 4 (orders 1 to 3 and the impatient one)", rows, refs)
			}
		})
	}
}

// start runs the service's binary on dsn and a loopback port of its own,
// with flags, until the test ends, and returns its URL once it logs that
// it is listening.
func start(t *testing.T, dsn string, flags ...string) string {
	t.Helper()
	cmd := exec.Command(cmdtest.Binary(t, "github.com/idemkit/idem/examples/payments"), append([]string{"-dsn", dsn, "-addr", "127.0.0.1:0"}, flags...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	if !lines.Scan() || !strings.Contains(lines.Text(), "msg=listening") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("first log line %q, want listening", lines.Text())
	}
	listening := lines.Text()
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	t.Cleanup(func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("the service stopped by SIGTERM: %v, want exit 0", err)
		}
	})
	return listening[strings.Index(listening, "addr=")+len("addr="):]
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// post sends a charge with key, as the API client sk_test_alice.
func post(t *testing.T, url, key, body string) answer {
	t.Helper()
	return send(t, http.DefaultClient, "POST", url+"/v1/charges", key, body)
}

// send sends a request as the API client sk_test_alice through c, and
// reads the answer. It is called from the test's goroutines too, so it
// reports a failure with t.Error and returns a zero answer.
func send(t *testing.T, c *http.Client, method, target, key, body string) answer {
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	req.Header.Set("Authorization", "Bearer sk_test_alice")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}
