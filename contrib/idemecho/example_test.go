package idemecho_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemecho"
	"github.com/idemkit/idem/idemhttp"
)

// An echo route behind idemhttp: the handler binds the order, writes it
// through idemhttp.TxFrom(c.Request().Context()) and answers with c.JSON
// or an error; a retry with the same key replays the answer.
func ExampleMiddleware() {
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_echo_keys"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE example_echo_orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer db.Exec(`DROP TABLE example_echo_orders, example_echo_keys`)

	mw, err := idemhttp.New(idemhttp.Config{
		Store: store, DB: db, Required: true,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your authentication's caller
	})
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	e.POST("/v1/orders", func(c echo.Context) error {
		var order struct {
			Item string `json:"item"`
		}
		if err := c.Bind(&order); err != nil {
			return err // echo's 400: stored and replayed
		}
		ctx := c.Request().Context()
		var id int64
		if err := idemhttp.TxFrom(ctx).QueryRowContext(ctx, `INSERT INTO example_echo_orders (item) VALUES ($1) RETURNING id`, order.Item).Scan(&id); err != nil {
			return err // echo's 500: rolled back, and a retry runs again
		}
		return c.JSON(http.StatusCreated, map[string]int64{"id": id})
	}, idemecho.Middleware(mw))
	srv := httptest.NewServer(e)
	defer srv.Close()

	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"item": "book"}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("X-Account", "acct-7")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"order-7"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), body)
	}
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
}
