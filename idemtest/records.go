package idemtest

import "time"

// Records is rows of idem's table written by one set-based INSERT (no Do
// per row): keys k-From to k-(To-1) of Scope, with Status and token i
// for key k-i, created Ago before the database's now and one millisecond
// apart going back, their leases ending Lease after now (before it when
// negative). Completed rows carry a 200-byte body and a small header,
// like a typical JSON response. It fills a table of idem's (one that
// [idem.Store.Migrate] made) with as many records as a test needs, in
// one statement, for a test of what a big table does: a purge, an
// upgrade, a measurement. Run the statement of the table's database:
//
//	q, args := idemtest.Records{Scope: "s", Status: "completed", From: 0, To: 100_000, Ago: 48 * time.Hour}.Postgres(store.Table())
//	_, err := db.ExecContext(ctx, q, args...)
//
// Status is one of idem's (idem.StatusCompleted, ...), as a string.
// With Retention, each row has the expiry idem gives it: its completion
// (or its lease's end) and Retention; without, it has none, as a row of
// a table of an earlier schema version, which expires by the Store's
// retention.
type Records struct {
	Scope, Status string
	From, To      int
	Ago, Lease    time.Duration
	Retention     time.Duration
}

// Postgres is the INSERT of r into table on PostgreSQL, and its
// arguments.
func (r Records) Postgres(table string) (string, []any) {
	col, expiry, args := "", "", []any{r.Scope, r.Status, r.Lease.Microseconds(), r.Ago.Microseconds(), r.From, r.To}
	if r.Retention > 0 {
		col, expiry = ", expires_at", `,
  (CASE WHEN $2 = 'completed' THEN ts ELSE statement_timestamp() + $3::bigint * interval '1 microsecond' END) + $7::bigint * interval '1 microsecond'`
		args = append(args, r.Retention.Microseconds())
	}
	return `INSERT INTO ` + table + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body` + col + `)
SELECT $1, 'k-' || i, 'POST /v1/charges', md5(i::text), $2, i,
  statement_timestamp() + $3::bigint * interval '1 microsecond', ts,
  CASE WHEN $2 = 'completed' THEN ts END, CASE WHEN $2 = 'completed' THEN 201 END,
  CASE WHEN $2 = 'completed' THEN '\x0100'::bytea END, CASE WHEN $2 = 'completed' THEN convert_to(repeat('x', 200), 'UTF8') END` + expiry + `
FROM (SELECT i, statement_timestamp() - $4::bigint * interval '1 microsecond' - i * interval '1 millisecond' AS ts
  FROM generate_series($5::bigint, $6::bigint - 1) i) g`, args
}

// MySQL is the INSERT of r into table on MySQL, MariaDB and TiDB, and
// its arguments.
func (r Records) MySQL(table string) (string, []any) {
	digits, sum := Numbers(r.To - r.From)
	col, expiry, args := "", "", []any{r.Scope, r.Status, r.Lease.Microseconds(), r.Status, r.Status, r.Status, r.Status}
	if r.Retention > 0 {
		col, expiry = ", expires_at", `,
  IF(? = 'completed', ts, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) + INTERVAL ? MICROSECOND`
		args = append(args, r.Status, r.Lease.Microseconds(), r.Retention.Microseconds())
	}
	return `INSERT INTO ` + table + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body` + col + `)
SELECT ?, CONCAT('k-', i), 'POST /v1/charges', SHA2(i, 256), ?, i,
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ts,
  IF(? = 'completed', ts, NULL), IF(? = 'completed', 201, NULL), IF(? = 'completed', X'0100', NULL), IF(? = 'completed', REPEAT('x', 200), NULL)` + expiry + `
FROM (SELECT i, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND - INTERVAL i * 1000 MICROSECOND AS ts
  FROM (SELECT ? + ` + sum + ` AS i FROM ` + digits + `) n
  WHERE i < ?) g`, append(args, r.Ago.Microseconds(), r.From, r.To)
}

// SQLiteNow is the SQLite dialect's clock: microseconds since the Unix
// epoch, which its tables store times in.
const SQLiteNow = "(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)"

// SQLite is the INSERT of r into table on SQLite, and its arguments:
// times are integer microseconds, the body a BLOB (the table is STRICT).
func (r Records) SQLite(table string) (string, []any) {
	col, expiry, args := "", "", []any{r.From, r.To, r.Scope, r.Status, r.Lease.Microseconds(), r.Ago.Microseconds()}
	if r.Retention > 0 {
		col, expiry = ", expires_at", `,
  (CASE WHEN ?4 = 'completed' THEN `+SQLiteNow+` - ?6 - i * 1000 ELSE `+SQLiteNow+` + ?5 END) + ?7`
		args = append(args, r.Retention.Microseconds())
	}
	return `WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
INSERT INTO ` + table + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, completed_at, response_status, response_headers, response_body` + col + `)
SELECT ?3, 'k-' || i, 'POST /v1/charges', hex(randomblob(32)), ?4, i,
  ` + SQLiteNow + ` + ?5, ` + SQLiteNow + ` - ?6 - i * 1000,
  CASE WHEN ?4 = 'completed' THEN ` + SQLiteNow + ` - ?6 - i * 1000 END, CASE WHEN ?4 = 'completed' THEN 201 END,
  CASE WHEN ?4 = 'completed' THEN X'0100' END, CASE WHEN ?4 = 'completed' THEN zeroblob(200) END` + expiry + `
FROM n`, args
}
