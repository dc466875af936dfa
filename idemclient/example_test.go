package idemclient_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/idemkit/idem/idemclient"
)

// A server that fails the first attempt with a 503 and answers the second:
// the client sees only the 201, and both attempts carried one key.
func Example() {
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client := &http.Client{Transport: &idemclient.Transport{}}
	resp, err := client.Post(srv.URL+"/v1/charges", "application/json",
		strings.NewReader(`{"amount": 1999, "currency": "EUR"}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	mu.Lock()
	defer mu.Unlock()
	fmt.Println("status:", resp.StatusCode)
	fmt.Println("attempts:", len(keys))
	fmt.Println("same key:", keys[0] == keys[1])
	fmt.Println("sent as an sf-string:", keys[0] == `"`+idemclient.Key(resp)+`"`)
	// Output:
	// status: 201
	// attempts: 2
	// same key: true
	// sent as an sf-string: true
}
