//go:build linux

package failover_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// BenchmarkStandbyWait is what waiting for the standby adds to a payment
// through Store.Do, side by side: each op is one fresh key paid (claim,
// business row, completion, COMMIT), then with "standbys-1" the wait
// until the commit has reached the standby (Store.WaitReplicated). The
// standby streams over the loopback or through the test's proxy, which
// delays each chunk 5 ms one way (a 10 ms round trip); "serial" is one
// client, "parallel" GOMAXPROCS×4 clients at once, and "http" one client
// through the idemhttp middleware with Config.Standbys.
//
//	cd integration_test && GOWORK=off go test -run '^$' -bench StandbyWait -benchtime 400x -count 5 ./failover
func BenchmarkStandbyWait(b *testing.B) {
	tpl := newTemplate(b)
	for _, link := range []struct {
		name  string
		delay time.Duration
	}{{"loopback", 0}, {"link-10ms-rtt", linkDelay}} {
		store, err := idem.New(idem.Postgres)
		if err != nil {
			b.Fatal(err)
		}
		c := tpl.startCluster(b, "bench-"+link.name, link.delay, func(db *sql.DB) error {
			if err := store.Migrate(context.Background(), db); err != nil {
				return err
			}
			_, err := db.Exec(`CREATE TABLE payments (id bigserial PRIMARY KEY, pay_key text NOT NULL, charge text NOT NULL)`)
			return err
		})
		db := c.primary.open(b)
		db.SetMaxOpenConns(64)
		db.SetMaxIdleConns(64)
		var seq atomic.Int64
		pay := func(standbys int) error {
			key := fmt.Sprintf("b%d", seq.Add(1))
			req := idem.Request{Scope: "bench", Key: key, Operation: "pay", Fingerprint: idem.Fingerprint([]byte(key))}
			ctx := context.Background()
			err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				_, err := store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
					_, err := tx.ExecContext(ctx, `INSERT INTO payments (pay_key, charge) VALUES ($1, 'ch')`, key)
					return idem.Response{StatusCode: 201}, err
				})
				return err
			})
			if err == nil && standbys > 0 {
				err = store.WaitReplicated(ctx, db, standbys, 10*time.Second)
			}
			return err
		}
		for _, standbys := range []int{0, 1} {
			b.Run(fmt.Sprintf("%s/serial/standbys-%d", link.name, standbys), func(b *testing.B) {
				for b.Loop() {
					if err := pay(standbys); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		for _, standbys := range []int{0, 1} {
			pay := (&bank{store: store, db: db, calls: map[string]int{}}).viaHTTP(b, standbys)
			b.Run(fmt.Sprintf("%s/http/standbys-%d", link.name, standbys), func(b *testing.B) {
				for b.Loop() {
					key := fmt.Sprintf("h%d", seq.Add(1))
					if _, _, err := pay(context.Background(), key); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		for _, standbys := range []int{0, 1} {
			b.Run(fmt.Sprintf("%s/parallel/standbys-%d", link.name, standbys), func(b *testing.B) {
				b.SetParallelism(4)
				var failed atomic.Pointer[error]
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := pay(standbys); err != nil {
							failed.CompareAndSwap(nil, &err)
						}
					}
				})
				if err := failed.Load(); err != nil {
					b.Fatal(*err)
				}
			})
		}
	}
}
