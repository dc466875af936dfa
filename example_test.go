package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	_ "github.com/lib/pq"

	"github.com/idemkit/idem"
)

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
	store := idem.New(idem.Postgres)
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
