package idem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

// A charge runs at most once per idempotency key: Do runs inside the
// transaction that writes the charge, and the retry of the same request
// replays the stored response instead of charging again. (SQLite keeps
// the example self-contained; PostgreSQL, MySQL and TiDB read the same.)
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithTable("example_keys")) // a bad option is an error here, never later
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE example_charges (id INTEGER PRIMARY KEY, customer TEXT, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"amount":1999,"currency":"EUR"}`)
	charge := func() idem.Result {
		req := idem.Request{
			Scope:       "customer-42", // keys never collide across customers
			Key:         "9d1c0f6e-charge",
			Operation:   "POST /v1/charges",
			Fingerprint: idem.Fingerprint(body),
		}
		var res idem.Result
		// RunTx retries serialization failures and deadlocks; a retried
		// duplicate replays.
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			var err error
			res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
				r, err := tx.ExecContext(ctx, `INSERT INTO example_charges (customer, amount) VALUES (?, ?)`, "customer-42", 1999)
				if err != nil {
					return idem.Response{}, err // nothing is stored; the retry runs again
				}
				id, _ := r.LastInsertId()
				return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		return res
	}
	for range 2 {
		res := charge()
		fmt.Println(res.StatusCode, string(res.Body), "replayed:", res.Replayed)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM example_charges`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}

// Fingerprint length-prefixes its parts, so that moving bytes from one part
// to the next changes the digest.
func ExampleFingerprint() {
	a := idem.Fingerprint([]byte("POST"), []byte("/v1/charges"), []byte(`{"amount":100}`))
	b := idem.Fingerprint([]byte("POST"), []byte("/v1/charges"), []byte(`{"amount":100}`))
	c := idem.Fingerprint([]byte("POST /v1"), []byte("/charges"), []byte(`{"amount":100}`))
	fmt.Println(len(a), a == b, a == c)
	// Output: 64 true false
}

// ValidateKey says what is wrong with a key; no key is ever trimmed or
// truncated to make it fit.
func ExampleValidateKey() {
	for _, key := range []string{"order-7f3a", "", "two words", "ключ"} {
		err := idem.ValidateKey(key)
		fmt.Printf("%q: %v (invalid: %v)\n", key, err, errors.Is(err, idem.ErrInvalidKey))
	}
	// Output:
	// "order-7f3a": <nil> (invalid: false)
	// "": idem: invalid idempotency key: empty (invalid: true)
	// "two words": idem: invalid idempotency key: byte 0x20 at offset 3 is not visible ASCII (0x21..0x7E) (invalid: true)
	// "ключ": idem: invalid idempotency key: byte 0xd0 at offset 0 is not visible ASCII (0x21..0x7E) (invalid: true)
}

// Do runs inside the transaction that writes the business rows; RunTx
// retries it when the database aborts a duplicate (serialization failure,
// deadlock), and the retry replays.
func ExampleStore_Do() {
	db, err := sql.Open("postgres", "postgres://localhost/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	store, err := idem.New(idem.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	req := idem.Request{
		Scope:       "customer-42",
		Key:         "9d1c0f6e-charge",
		Operation:   "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte(`{"amount":1999,"currency":"EUR"}`)),
	}
	var res idem.Result
	err = idem.RunTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, func(tx *sql.Tx) error {
		res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			var id int64
			if err := tx.QueryRowContext(ctx,
				`INSERT INTO charges (customer, amount) VALUES ($1, $2) RETURNING id`, "customer-42", 1999).Scan(&id); err != nil {
				return idem.Response{}, err // rolled back; the key stays free
			}
			return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
		})
		return err
	})
	var inflight *idem.InFlightError
	switch {
	case errors.Is(err, idem.ErrMismatch):
		fmt.Println("422: key reused with another payload")
	case errors.As(err, &inflight):
		fmt.Println("409: retry after", inflight.RetryAfter)
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(res.StatusCode, string(res.Body), "replayed:", res.Replayed)
	}
}

// chargeCard asks a payment provider to charge amount cents, passing
// relayKey as the provider's own idempotency key, so that a retried call
// (after a crash, a timeout or a takeover) charges once.
func chargeCard(ctx context.Context, relayKey string, amount int) (chargeID string, err error) {
	form := url.Values{"amount": {fmt.Sprint(amount)}, "currency": {"eur"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://payments.example/v1/charges", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", relayKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("provider: %s", resp.Status)
	}
	var charge struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&charge); err != nil {
		return "", err
	}
	return charge.ID, nil
}

// Two-phase use: claim the key, call the provider outside any transaction
// with a heartbeat keeping the lease, then store the result and the
// business row together. It needs a PostgreSQL database with the table
// (Store.Migrate) and a charges table, so it is compiled but not run.
func ExampleStore_Begin() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres, idem.WithLease(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	req := idem.Request{
		Scope:       "customer-42",
		Key:         "6f1d2c9e-5b0a-4c1e-9d8e-3a7b2f0c4d11", // the client's Idempotency-Key
		Operation:   "POST /v1/payments",
		Fingerprint: idem.Fingerprint([]byte("amount=1000&currency=eur")),
	}

	claim, replay, err := store.Begin(ctx, db, req)
	if inflight, ok := errors.AsType[*idem.InFlightError](err); ok {
		fmt.Printf("409, Retry-After: %.0f\n", inflight.RetryAfter.Seconds())
		return
	}
	if err != nil {
		log.Fatal(err) // 422 for ErrMismatch, 400 for ErrInvalidKey, else 500
	}
	if replay != nil {
		fmt.Printf("%d %s (replayed)\n", replay.StatusCode, replay.Body)
		return
	}

	// Heartbeat: keep the lease while the provider call runs; stop the
	// call if another request took the key over.
	work, stop := context.WithCancel(ctx)
	go func() {
		tick := time.NewTicker(20 * time.Second) // a third of the lease
		defer tick.Stop()
		for {
			select {
			case <-work.Done():
				return
			case <-tick.C:
				if err := claim.Extend(work, db, time.Minute); errors.Is(err, idem.ErrLeaseLost) {
					stop()
					return
				}
			}
		}
	}()
	chargeID, err := chargeCard(work, claim.RelayKey(), 1000)
	stop()
	if err != nil {
		// The next retry runs again, and the provider, seeing the same
		// RelayKey, does not charge twice.
		if rerr := claim.Release(ctx, db); rerr != nil {
			log.Print(rerr)
		}
		log.Fatal(err)
	}

	resp := idem.Response{StatusCode: 201, Body: []byte(`{"charge":"` + chargeID + `"}`)}
	err = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO charges (id, customer, amount) VALUES ($1, $2, $3)", chargeID, req.Scope, 1000); err != nil {
			return err
		}
		return claim.Complete(ctx, tx, resp) // ErrLeaseLost rolls the row back
	})
	if errors.Is(err, idem.ErrLeaseLost) {
		// Another request took the key over and stores the result; the
		// provider gave it the same charge.
		log.Print(err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d %s\n", resp.StatusCode, resp.Body)
}

// A caller that commits its own transaction around Do holds its answer
// until the commit, or the record a replay was read from, has reached a
// standby, so that a failover cannot lose an answered payment. Past the
// bound the outcome is unknown: the client is told to retry with the
// same key. It needs a PostgreSQL primary with a streaming standby, so
// it is compiled but not run.
func ExampleStore_WaitReplicated() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://primary/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	req := idem.Request{Scope: "customer-42", Key: "9d1c0f6e-charge", Operation: "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte(`{"amount":1999,"currency":"EUR"}`))}
	var res idem.Result
	err = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO charges (customer, amount) VALUES ($1, $2)`, "customer-42", 1999); err != nil {
				return idem.Response{}, err
			}
			return idem.Response{StatusCode: 201}, nil
		})
		return err
	})
	if err == nil {
		err = store.WaitReplicated(ctx, db, 1, 2*time.Second)
	}
	switch {
	case errors.Is(err, idem.ErrNotReplicated):
		fmt.Println("503: outcome unknown, retry with the same key")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(res.StatusCode, "replayed:", res.Replayed)
	}
}

// A request's key memory is kept by its record: past the request's
// retention, a Store without key memory of its own, and its purge, still
// refuse the key until the record's forget time. PurgeBatchDetail tells
// what a batch deleted from what it made tombstones.
func ExampleStore_PurgeBatchDetail() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite) // no key memory of its own
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	do := func(key string, retention, keyMemory time.Duration) error {
		req := idem.Request{Scope: "customer-42", Key: key, Operation: "POST /v1/charges",
			Fingerprint: idem.Fingerprint([]byte(key)), Retention: retention, KeyMemory: keyMemory}
		return idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := store.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201}, nil
			})
			return err
		})
	}
	// A payment's key is refused for 30 days past its retention; a
	// search's is forgotten at its expiry.
	for key, memory := range map[string]time.Duration{"payment": 30 * 24 * time.Hour, "search": 0} {
		if err := do(key, 10*time.Millisecond, memory); err != nil {
			log.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	p, err := store.PurgeBatchDetail(ctx, idem.NewSQLRunner(db, nil), 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deleted %d, tombstones %d\n", p.Deleted, p.Tombstoned)
	fmt.Println("the payment again:", errors.Is(do("payment", 10*time.Millisecond, 0), idem.ErrExpired))
	// Output:
	// deleted 1, tombstones 1
	// the payment again: true
}

// A charge records where it can be fetched (Response.Reference). Past its
// retention the purge drops the response but keeps the reference with the
// key, so the late retry that ErrExpired refuses is told where the charge
// is: an HTTP service answers 410 with it as Location.
func ExampleExpiredError() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithRetention(10*time.Millisecond), idem.WithKeyMemory(30*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	req := idem.Request{Scope: "customer-42", Key: "order-7", Operation: "POST /v1/charges", Fingerprint: idem.Fingerprint([]byte("4200 EUR"))}
	charge := func() error {
		return idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := store.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201, Body: []byte(`{"id":"ch_1"}`), Reference: "/v1/charges/ch_1"}, nil
			})
			return err
		})
	}
	if err := charge(); err != nil {
		log.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := store.PurgeBatchDetail(ctx, idem.NewSQLRunner(db, nil), 100); err != nil {
		log.Fatal(err)
	}
	var expired *idem.ExpiredError
	if err := charge(); errors.As(err, &expired) {
		fmt.Println("410, ErrExpired:", errors.Is(err, idem.ErrExpired), "Location:", expired.Reference)
	}
	// Output:
	// 410, ErrExpired: true Location: /v1/charges/ch_1
}
