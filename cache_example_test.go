package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
)

// A replay cache answers the retry of a completed request from memory:
// Cached before the transaction, so that a hit opens none, and Do in
// RunTx otherwise, whose commit puts the record in the cache.
func ExampleWithReplayCache() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-cache-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 10_000, MaxBytes: 64 << 20}))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	charge := func(req idem.Request) (idem.Result, error) {
		if res, ok, err := store.Cached(ctx, req); ok {
			return res, err // a replay or ErrMismatch, without a transaction
		}
		var res idem.Result
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			var err error
			res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
			})
			return err
		})
		return res, err
	}
	req := idem.Request{Scope: "customer-42", Key: "order-7", Operation: "POST /v1/charges", Fingerprint: idem.Fingerprint([]byte("amount=1000"))}
	for range 2 {
		res, err := charge(req)
		if err != nil {
			log.Fatal(err)
		}
		_, cached, _ := store.Cached(ctx, req)
		fmt.Println(res.StatusCode, string(res.Body), "replayed:", res.Replayed, "cached:", cached)
	}
	// Output:
	// 201 {"charge":"ch_1"} replayed: false cached: true
	// 201 {"charge":"ch_1"} replayed: true cached: true
}

// A caller that begins and commits its own transaction tracks its
// commit, so that what Do completes in it enters the replay cache once
// it has committed, and never when it rolls back.
func ExampleTrackCommit() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-track-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithReplayCache(idem.ReplayCache{MaxEntries: 10_000}))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	req := idem.Request{Scope: "customer-42", Key: "order-8", Operation: "POST /v1/charges", Fingerprint: idem.Fingerprint([]byte("amount=500"))}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	end := idem.TrackCommit(tx)
	if _, err := store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 201}, nil
	}); err != nil {
		_ = tx.Rollback()
		end(err)
		log.Fatal(err)
	}
	err = tx.Commit()
	end(err)
	if err != nil {
		log.Fatal(err)
	}
	_, cached, _ := store.Cached(ctx, req)
	fmt.Println("cached:", cached)
	// Output: cached: true
}
