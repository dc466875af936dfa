package idemgin_test

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

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgin"
	"github.com/idemkit/idem/idemhttp"
)

// A gin route behind idemhttp: the handler binds the order, writes it
// through idemgin.TxFrom(c), the transaction of c.Request's context, and
// answers with c.JSON; a retry with the same key replays that answer.
func ExampleMiddleware() {
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_gin_keys"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE example_gin_orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer db.Exec(`DROP TABLE example_gin_orders, example_gin_keys`)

	mw, err := idemhttp.New(idemhttp.Config{
		Store: store, DB: db, Required: true,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your authentication's caller
	})
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.POST("/v1/orders", idemgin.Middleware(mw), func(c *gin.Context) {
		var order struct {
			Item string `json:"item" binding:"required"`
		}
		if err := c.ShouldBindJSON(&order); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()}) // a 4xx is stored and replayed
			return
		}
		var id int64
		if err := idemgin.TxFrom(c).QueryRowContext(c.Request.Context(), `INSERT INTO example_gin_orders (item) VALUES ($1) RETURNING id`, order.Item).Scan(&id); err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": "try again"}) // a 5xx rolls back; a retry runs again
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": id})
	})
	srv := httptest.NewServer(r)
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
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), body)
	}
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
}
