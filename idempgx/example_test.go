package idempgx_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
)

// A pgxpool service charges a card at most once per idempotency key: DoOn
// runs inside the pgx.Tx that writes the charge, and a retry of the same
// request replays the stored response instead of charging again.
func ExampleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := idem.New(idem.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.MigrateOn(ctx, idempgx.Conn(pool)); err != nil {
		log.Fatal(err)
	}

	req := idem.Request{Scope: "customer-42", Key: "9d1c0f6e-charge", Operation: "POST /v1/charges", Fingerprint: idem.Fingerprint([]byte("1999"))}
	var res idem.Result
	// RunTx retries serialization failures and deadlocks; a retried
	// duplicate replays.
	err = idempgx.RunTx(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var err error
		res, err = store.DoOn(ctx, idempgx.Tx(tx), req, func(ctx context.Context) (idem.Response, error) {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO charges (customer, amount) VALUES ($1, $2) RETURNING id`, "customer-42", 1999).Scan(&id); err != nil {
				return idem.Response{}, err // nothing is stored; the retry runs again
			}
			return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.StatusCode, string(res.Body), "replayed:", res.Replayed)
}

// A pgxpool service puts idemhttp's middleware in front of its handler on
// the pool's Runner; the handler writes its rows through the pgx.Tx of
// idempgx.TxFrom, in which the middleware stores the answer with the key.
func ExampleTxFrom() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(idemhttp.Config{
		Store: store, Runner: idempgx.New(pool, pgx.TxOptions{}), Required: true,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your authentication's caller
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /v1/orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idempgx.TxFrom(r.Context()) // write your rows here; never Commit or Rollback it
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ('book') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
