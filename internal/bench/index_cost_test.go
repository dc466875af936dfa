package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// TestIndexCost measures what the created_at index costs on the write
// path and what it buys the purge: a B-tree (the schema's), BRIN
// (PostgreSQL) and no index, on fresh tables, alternating, a few rounds:
// a set-based insert of 200,000 expired records (the conformance suite's
// expired), 8 workers running Do for 3 s, then a purge of the
// records in batches of 1,000. It runs once per server with a created_at
// index, through pgx's database/sql driver on PostgreSQL: not on MySQL or
// MariaDB, where created_at leads the clustered primary key (schema
// version 2). It is a measurement, not a check, so it runs only with
// IDEM_INDEX_COST=1; docs/design.md quotes it.
//
//	IDEM_INDEX_COST=1 go test -run TestIndexCost -v -timeout 30m ./internal/bench
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
	ctx := context.Background()
	for _, c := range []struct {
		tg       target
		variants []string
		dropOn   bool // DROP INDEX names the table too (MySQL's syntax)
	}{
		{target{"pgx", idem.Postgres, postgresServer}, []string{"btree", "brin", "none"}, false},
		{target{"mysql", idem.TiDB, tidbServer}, []string{"btree", "none"}, true},
		{target{"sqlite", idem.SQLite, nil}, []string{"btree", "none"}, false},
	} {
		t.Run(c.tg.dialect.Name(), func(t *testing.T) {
			db := c.tg.open(t)
			for round := range rounds {
				for _, v := range c.variants {
					s := table(t, db, c.tg.dialect, idem.WithRetention(time.Hour))
					index := s.Table() + "_created_at_idx"
					switch {
					case v == "none" && c.dropOn:
						exec(t, db, "DROP INDEX "+index+" ON "+s.Table())
					case v == "none":
						exec(t, db, "DROP INDEX "+index)
					case v == "brin":
						exec(t, db, "DROP INDEX "+index)
						exec(t, db, "CREATE INDEX "+index+" ON "+s.Table()+" USING brin (created_at)")
					}

					start := time.Now()
					exec(t, db, expired(c.tg.dialect, s.Table(), rows), rows)
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
								req := Request(fmt.Sprintf("w%d-%d", w, i))
								req.Scope = "live"
								if errs[w] = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
									_, err := s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) { return response, nil })
									return err
								}); errs[w] != nil {
									return
								}
								done[w]++
							}
						})
					}
					wg.Wait()
					total := 0
					for w := range workers {
						if errs[w] != nil {
							t.Fatal(errs[w])
						}
						total += done[w]
					}

					indexBytes, hot := "-", ""
					if c.tg.dialect == idem.Postgres {
						if v != "none" {
							indexBytes = fmt.Sprint(int64Of(t, db, "SELECT pg_relation_size($1::regclass)", index) / int64(rows+total))
						}
						upd := int64Of(t, db, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = $1::regclass", s.Table())
						hotUpd := int64Of(t, db, "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass", s.Table())
						hot = fmt.Sprintf(", HOT completions %d/%d (stats may lag)", hotUpd, upd)
					}

					start = time.Now()
					purged, err := s.Purge(ctx, db, 1000)
					if err != nil {
						t.Fatal(err)
					}
					took := time.Since(start)
					t.Logf("round %d, %-5s: bulk insert %6.2f µs/row; Do %5.0f/s with %d workers%s; index %s bytes/row; purge %d rows in %v (%.0f rows/s)",
						round+1, v, float64(bulk.Microseconds())/rows, float64(total)/doFor.Seconds(), workers, hot, indexBytes,
						purged, took.Round(time.Millisecond), float64(purged)/took.Seconds())
				}
			}
		})
	}
}

// expired is the INSERT of rows completed records of scope "expired" into
// table, created two hours ago and one millisecond apart going back, each
// with a 200-byte body; its one argument is rows.
func expired(d idem.Dialect, table string, rows int) string {
	insert := "INSERT INTO " + table + " (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body)\n"
	switch d {
	case idem.Postgres:
		return insert + `SELECT 'expired', 'e-' || n, 'POST /v1/charges', md5(n::text), 'completed', n, at, at, at, 201, '\x0100'::bytea, convert_to(repeat('x', 200), 'UTF8')
FROM (SELECT n, statement_timestamp() - interval '2 hours' - n * interval '1 millisecond' AS at FROM generate_series(1, $1::int) n) g`
	case idem.SQLite:
		return "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < ?1)\n" + insert +
			`SELECT 'expired', 'e-' || n, 'POST /v1/charges', hex(randomblob(32)), 'completed', n, at, at, at, 201, X'0100', zeroblob(200)
FROM (SELECT n, CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 7200000000 - n * 1000 AS at FROM c)`
	}
	from, sum := digits(rows)
	return insert + `SELECT 'expired', CONCAT('e-', n), 'POST /v1/charges', MD5(n), 'completed', n, at, at, at, 201, X'0100', REPEAT('x', 200)
FROM (SELECT n, UTC_TIMESTAMP(6) - INTERVAL 2 HOUR - INTERVAL n * 1000 MICROSECOND AS at
  FROM (SELECT 1 + ` + sum + ` AS n FROM ` + from + `) c WHERE n <= ?) g`
}
