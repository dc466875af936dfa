package conformance

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// What the created_at index costs on the write path and what it buys the
// purge: a B-tree (the schema's), BRIN (Postgres) and no index, measured
// on fresh tables, alternating, a few rounds. It is a measurement, not a
// check, so it runs only with IDEM_INDEX_COST=1; docs/design.md quotes it.
func TestIndexCost(t *testing.T) {
	if os.Getenv("IDEM_INDEX_COST") != "1" {
		t.Skip("set IDEM_INDEX_COST=1 to measure the cost of the created_at index")
	}
	const (
		rows    = 200_000
		rounds  = 3
		workers = 8
		doFor   = 3 * time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		if e.name == "postgres-libpq" || e.native {
			t.Skip("measured once per server, through pgx's database/sql driver")
		}
		if e.dialect == idem.MySQL || e.dialect == idem.MariaDB {
			t.Skip("created_at leads MySQL's clustered primary key (schema version 2): there is no created_at index to compare")
		}
		variants := []string{"btree", "none"}
		if e.dialect == idem.Postgres {
			variants = []string{"btree", "brin", "none"}
		}
		for round := range rounds {
			for _, v := range variants {
				s := e.store(idem.WithRetention(time.Hour))
				index := s.Table() + "_created_at_idx"
				switch {
				case v == "none" && e.mysqlFamily():
					e.exec("DROP INDEX " + index + " ON " + s.Table())
				case v == "none":
					e.exec("DROP INDEX " + index)
				case v == "brin":
					e.exec("DROP INDEX " + index)
					e.exec("CREATE INDEX " + index + " ON " + s.Table() + " USING brin (created_at)")
				}

				start := time.Now()
				e.seed(s, scopeExpired, rows, 2*time.Hour, -2*time.Hour, "completed")
				bulk := time.Since(start)

				var (
					wg    sync.WaitGroup
					done  [workers]int
					errs  [workers]error
					until = time.Now().Add(doFor)
				)
				for w := range workers {
					wg.Go(func() {
						for i := 0; time.Now().Before(until); i++ {
							req := charge(fmt.Sprintf("w%d-%d", w, i), "1")
							req.Scope = scopeLive
							if errs[w] = e.doOK(s, req); errs[w] != nil {
								return
							}
							done[w]++
						}
					})
				}
				wg.Wait()
				total := 0
				for w := range workers {
					must(t, errs[w])
					total += done[w]
				}

				indexBytes, hot := "-", ""
				if e.dialect == idem.Postgres {
					if v != "none" {
						indexBytes = fmt.Sprint(e.int64("SELECT pg_relation_size(?::regclass)", index) / int64(rows+total))
					}
					upd := e.int64("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = ?::regclass", s.Table())
					hotUpd := e.int64("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = ?::regclass", s.Table())
					hot = fmt.Sprintf(", HOT completions %d/%d (stats may lag)", hotUpd, upd)
				}

				start = time.Now()
				purged, err := s.Purge(context.Background(), e.db, 1000)
				must(t, err)
				took := time.Since(start)
				t.Logf("round %d, %-5s: bulk insert %6.2f µs/row; Do %5.0f/s with %d workers%s; index %s bytes/row; purge %d rows in %v (%.0f rows/s)",
					round+1, v, float64(bulk.Microseconds())/rows, float64(total)/doFor.Seconds(), workers, hot, indexBytes,
					purged, took.Round(time.Millisecond), float64(purged)/took.Seconds())
			}
		}
	})
}
