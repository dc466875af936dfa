package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The service's tests here run it in process on SQLite, which needs no
// server; the module integration_test runs its binary on each server
// (examples/payments there).

// dsn is a fresh SQLite file of the test's own, in the idem command's
// form.
func dsn(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "payments.db") }

// service is the service running for a test.
type service struct {
	url     string
	db      *sql.DB
	charges string // its charges table
}

// start runs the service on a loopback port against dsn, on tables of its
// own that are dropped when the test ends.
func start(t *testing.T, dsn string, provider CardProvider) service {
	t.Helper()
	suffix := strings.ToLower(rand.Text()[:10])
	cfg := config{
		dsn: dsn, provider: provider, charges: "charges_" + suffix,
		idem: []idem.Option{idem.WithTable("idem_" + suffix), idem.WithLease(2 * time.Second)},
		log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	db, _, err := open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, func() (net.Listener, error) { return ln, nil }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		_ = ln.Close() // closed already, unless run failed before serving
		defer db.Close()
		for _, table := range []string{cfg.charges, "idem_" + suffix} {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
	})
	return service{url: "http://" + ln.Addr().String(), db: db, charges: cfg.charges}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// apiKey is the test client's API key.
const apiKey = "sk_test_alice"

func send(method, target, key, body string) (answer, error) {
	return sendAs(http.DefaultClient, apiKey, method, target, key, body)
}

// sendAs sends a request as the API client whose key is apiKey, through c.
func sendAs(c *http.Client, apiKey, method, target, key, body string) (answer, error) {
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}, err
}

func call(t *testing.T, method, target, key, body string) answer {
	t.Helper()
	a, err := send(method, target, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestPayments(t *testing.T) {
	provider := NewFakeProvider()
	testCharges(t, start(t, dsn(t), provider), provider)
}

func testCharges(t *testing.T, svc service, provider *FakeProvider) {
	base := svc.url
	const body = `{"amount": 1999, "currency": "EUR", "card": "4242424242424242"}`

	first := call(t, "POST", base+"/v1/charges", "order-1", body)
	again := call(t, "POST", base+"/v1/charges", "order-1", body)
	if first.status != 201 || again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("charge and retry: %d %s / %d %s %v", first.status, first.body, again.status, again.body, again.header)
	}
	var c chargeJSON
	if err := json.Unmarshal(first.body, &c); err != nil || c.Status != "succeeded" || c.Amount != 1999 {
		t.Fatalf("charge %s: %v", first.body, err)
	}
	if loc := again.header.Get("Location"); loc != "/v1/charges/"+c.ID {
		t.Fatalf("replayed Location %q", loc)
	}
	got := call(t, "GET", base+"/v1/charges/"+c.ID, "", "")
	var read chargeJSON
	if err := json.Unmarshal(got.body, &read); err != nil || got.status != 200 || read != c {
		t.Fatalf("GET: %d %s, want %+v", got.status, got.body, c)
	}
	if calls := provider.Calls(); len(calls) != 1 {
		t.Fatalf("provider calls by key after one charge and its replay: %v, want one call", calls)
	}

	// A slow provider and ten concurrent duplicates: they get 409s while
	// the charge runs, and retrying as Retry-After says, its replay.
	provider.SetDelay(500 * time.Millisecond)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []answer
		errs    []error
		saw409  bool
	)
	for range 10 {
		wg.Go(func() {
			var a answer
			var err error
			for range 20 {
				if a, err = send("POST", base+"/v1/charges", "order-2", body); err != nil || a.status != http.StatusConflict {
					break
				}
				mu.Lock()
				saw409 = true
				mu.Unlock()
				secs, _ := strconv.Atoi(a.header.Get("Retry-After"))
				time.Sleep(time.Duration(secs) * time.Second)
			}
			mu.Lock()
			defer mu.Unlock()
			answers, errs = append(answers, a), append(errs, err)
		})
	}
	wg.Wait()
	provider.SetDelay(0)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, a := range answers {
		if a.status != 201 || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("duplicate: %d %s, first %d %s", a.status, a.body, answers[0].status, answers[0].body)
		}
	}
	if !saw409 {
		t.Fatal("no duplicate saw a 409 while the provider call ran")
	}

	// A decline is a result: stored and replayed.
	declined := strings.Replace(body, "4242424242424242", DeclinedCard, 1)
	for i := range 2 {
		a := call(t, "POST", base+"/v1/charges", "order-3", declined)
		if a.status != 402 || (a.header.Get("Idempotent-Replayed") == "true") != (i == 1) {
			t.Fatalf("declined card, request %d: %d %s", i, a.status, a.body)
		}
	}

	// A provider failure is a 502 that is not stored: the retry charges.
	provider.SetFailRate(1)
	if a := call(t, "POST", base+"/v1/charges", "order-4", body); a.status != 502 {
		t.Fatalf("failing provider: %d %s", a.status, a.body)
	}
	provider.SetFailRate(0)
	if a := call(t, "POST", base+"/v1/charges", "order-4", body); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the failure: %d %s", a.status, a.body)
	}

	// Another API client sending the same key and body has a charge of
	// its own: keys are scoped by the caller.
	other, err := sendAs(http.DefaultClient, "sk_test_bob", "POST", base+"/v1/charges", "order-1", body)
	if err != nil || other.status != 201 || other.header.Get("Idempotent-Replayed") != "" || bytes.Equal(other.body, first.body) {
		t.Fatalf("another client with order-1: %d %s %v; want a charge of its own", other.status, other.body, err)
	}
	if a := call(t, "POST", base+"/v1/charges", "order-1", body); !bytes.Equal(a.body, first.body) {
		t.Fatalf("the first client's retry after the other's: %s, want %s", a.body, first.body)
	}
	anonymous, err := sendAs(http.DefaultClient, "", "POST", base+"/v1/charges", "order-1", body)
	if err != nil || anonymous.status != 401 {
		t.Fatalf("no API key: %d %s %v; want a 401", anonymous.status, anonymous.body, err)
	}

	// The middleware's own answers.
	if a := call(t, "POST", base+"/v1/charges", "", body); a.status != 400 {
		t.Fatalf("missing key: %d %s", a.status, a.body)
	}
	if a := call(t, "POST", base+"/v1/charges", "order-1", strings.Replace(body, "1999", "2000", 1)); a.status != 422 {
		t.Fatalf("reused key: %d %s", a.status, a.body)
	}
	var rows int
	if err := svc.db.QueryRow("SELECT COUNT(*) FROM " + svc.charges).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if n := provider.Charges(); n != 5 || rows != 5 {
		t.Fatalf("the provider made %d charges and the table holds %d, want 5 and 5 (orders 1 to 4, and bob's order 1)", n, rows)
	}
	// One call per key, and two for order-4, whose first call failed.
	counts := slices.Sorted(maps.Values(provider.Calls()))
	if !slices.Equal(counts, []int{1, 1, 1, 1, 2}) {
		t.Fatalf("provider calls per key: %v, want 1, 1, 1, 1 and 2", provider.Calls())
	}
}

// A client that gives up before the provider answers (curl --max-time
// shorter than -provider-delay) and retries five times: the provider call
// is not cancelled with the first request, the card is charged once and
// recorded once, and a retry gets the charge replayed.
func TestPaymentsClientGivesUp(t *testing.T) {
	provider := NewFakeProvider()
	provider.SetDelay(time.Second)
	svc := start(t, dsn(t), provider)
	c := &http.Client{Timeout: 300 * time.Millisecond}
	const body = `{"amount": 500, "currency": "EUR", "card": "4242424242424242"}`
	var replays, timeouts int
	for attempt := range 6 {
		if attempt > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		a, err := sendAs(c, apiKey, "POST", svc.url+"/v1/charges", "impatient-1", body)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			timeouts++
		case err != nil:
			t.Fatalf("attempt %d: %v", attempt+1, err)
		case a.status == http.StatusConflict:
		case a.status == 201 && a.header.Get("Idempotent-Replayed") == "true":
			replays++
		default:
			t.Fatalf("attempt %d: %d %s; want a timeout, a 409 or the replay", attempt+1, a.status, a.body)
		}
	}
	var rows int
	if err := svc.db.QueryRow("SELECT COUNT(*) FROM " + svc.charges).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	calls := slices.Collect(maps.Values(provider.Calls()))
	if timeouts == 0 || replays == 0 || !slices.Equal(calls, []int{1}) || provider.Charges() != 1 || rows != 1 {
		t.Fatalf("%d timeouts, %d replays, provider calls %v, %d charges, %d rows; want the first attempt to time out, a replay, one call, one charge, one row",
			timeouts, replays, calls, provider.Charges(), rows)
	}
}
