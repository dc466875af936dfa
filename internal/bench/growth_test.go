package bench

import (
	"os"
	"testing"

	"github.com/idemkit/idem"
)

// TestTableGrowth measures how many bytes a record costs, on a populated
// table: 100,000 records shaped like a JSON API's (a UUID key, a tenant
// scope, a SHA-256 fingerprint, a Content-Type header and an
// incompressible body of 200 or 2,000 bytes), measured with
// pg_total_relation_size and its parts, or information_schema.tables
// after ANALYZE TABLE, once per server through pgx's and MySQL's
// database/sql drivers. TiDB's table sizes are its storage engine's
// estimates, refreshed in the background, and SQLite is not measured. It
// is a measurement, so it runs only with IDEM_TABLE_GROWTH=1;
// docs/operations.md quotes it.
//
//	IDEM_TABLE_GROWTH=1 go test -run TestTableGrowth -v ./internal/bench
func TestTableGrowth(t *testing.T) {
	if os.Getenv("IDEM_TABLE_GROWTH") != "1" {
		t.Skip("set IDEM_TABLE_GROWTH=1 to measure the bytes per record")
	}
	const rows = 100_000
	header := "01010c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e" // idem's encoding of one header
	for _, tg := range []target{
		{"pgx", idem.Postgres, postgresServer},
		{"mysql", idem.MySQL, mysqlServer},
		{"mysql", idem.MariaDB, mariadbServer},
	} {
		t.Run(tg.dialect.Name(), func(t *testing.T) {
			db := tg.open(t)
			for _, body := range []int{200, 2000} {
				s := table(t, db, tg.dialect)
				if tg.dialect != idem.Postgres {
					from, sum := digits(rows)
					exec(t, db, `INSERT INTO `+s.Table()+` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body)
SELECT CONCAT('tenant-', LPAD(i % 5000, 6, '0')), UUID(), 'POST /v1/charges', SHA2(i, 256), 'completed', i,
  UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL i * 1000 MICROSECOND, UTC_TIMESTAMP(6), 201, UNHEX(?),
  LEFT(CONCAT(RANDOM_BYTES(1024), RANDOM_BYTES(1024)), ?)
FROM (SELECT `+sum+` AS i FROM `+from+`) n WHERE i < ?`, header, body, rows)
					exec(t, db, "ANALYZE TABLE "+s.Table()+" PERSISTENT FOR ALL")
					data := int64Of(t, db, "SELECT data_length FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", s.Table())
					index := int64Of(t, db, "SELECT index_length FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", s.Table())
					t.Logf("MySQL, body %4d B: %d B per record: clustered (data and primary key) %d, (scope, idem_key) index %d",
						body, (data+index)/rows, data/rows, index/rows)
					continue
				}
				exec(t, db, `INSERT INTO `+s.Table()+` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body)
SELECT 'tenant-' || lpad((i % 5000)::text, 6, '0'), gen_random_uuid()::text, 'POST /v1/charges', encode(sha256(i::text::bytea), 'hex'),
  'completed', i, statement_timestamp(), statement_timestamp() - i * interval '1 millisecond', statement_timestamp(), 201, decode($1, 'hex'),
  substring((SELECT string_agg(sha256((i * 1000 + j)::text::bytea), ''::bytea) FROM generate_series(1, ($2::int + 31) / 32) j) FROM 1 FOR $2::int)
FROM generate_series(1, $3::int) i`, header, body, rows)
				exec(t, db, "VACUUM ANALYZE "+s.Table())
				size := func(expr string) int64 {
					return int64Of(t, db, "SELECT "+expr+" FROM pg_class WHERE oid = $1::regclass", s.Table()) / rows
				}
				t.Logf("Postgres, body %4d B: %d B per record: heap %d, primary key %d, created_at index %d, TOAST %d",
					body, size("pg_total_relation_size(oid)"), size("pg_relation_size(oid)"),
					size("pg_relation_size((SELECT indexrelid FROM pg_index WHERE indrelid = oid AND indisprimary))"),
					size("pg_relation_size((SELECT indexrelid FROM pg_index WHERE indrelid = oid AND NOT indisprimary))"),
					size("COALESCE(pg_total_relation_size(NULLIF(reltoastrelid, 0)), 0)"))
			}
		})
	}
}
