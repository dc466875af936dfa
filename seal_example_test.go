package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

// The keys file that idem inspect and idem reseal read (--keys-file) is
// the application's too: ParseKeys reads it, and its last key seals.
func ExampleParseKeys() {
	file := strings.NewReader(`# idem's sealing keys: the last one seals
k2026a 3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
k2026b 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
`)
	current, keys, err := idem.ParseKeys(file)
	if err != nil {
		log.Fatal(err)
	}
	sealer, err := idem.NewAESGCMSealer(current, keys)
	if err != nil {
		log.Fatal(err)
	}
	_ = idem.WithSealer(sealer)
	fmt.Println(current, len(keys))

	_, _, err = idem.ParseKeys(strings.NewReader("k1 0f1e2d3c\n"))
	fmt.Println(err)
	// Output:
	// k2026b 2
	// idem: keys file: line 1: the key of "k1" is 4 bytes as hex; AES-256 takes 32 (64 hex digits, or 44 characters of base64)
}

// After a rotation, ResealBatch rewrites the records sealed with the old
// key one batch at a time, so that a tool can report its progress (as
// idem reseal does), pace the work, or stop and run again later: the
// records done are sealed with the current key and are not read again.
func ExampleStore_ResealBatch() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-reseal")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	keys := map[string][]byte{"k1": []byte(strings.Repeat("1", 32)), "k2": []byte(strings.Repeat("2", 32))}
	store := func(current string) *idem.Store {
		sealer, err := idem.NewAESGCMSealer(current, keys)
		if err != nil {
			log.Fatal(err)
		}
		s, err := idem.New(idem.SQLite, idem.WithSealer(sealer))
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	old := store("k1")
	if err := old.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	for i := range 5 {
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := old.Do(ctx, tx, idem.Request{Key: fmt.Sprintf("order-%d", i), Operation: "POST /v1/orders", Fingerprint: "f"},
				func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil })
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	rotated := store("k2") // k2 seals now; k1 still opens
	left, err := rotated.ResealLeft(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("to reseal:", left)
	var (
		at   idem.ResealCursor
		done int64
	)
	for {
		n, next, err := rotated.ResealBatch(ctx, db, at, 2)
		if err != nil {
			log.Fatal(err) // nothing of this batch was rewritten: run again later
		}
		done += n
		fmt.Printf("resealed %d (%d of %d)\n", n, done, left)
		if n < 2 {
			break
		}
		at = next
	}
	// Output:
	// to reseal: 5
	// resealed 2 (2 of 5)
	// resealed 2 (4 of 5)
	// resealed 1 (5 of 5)
}
