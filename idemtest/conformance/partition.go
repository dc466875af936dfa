package conformance

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// idem offers no partitioned layout: a partitioned table cannot keep
// (Scope, Key) unique across its partitions. This proves it for the naive
// daily layout on Postgres (declarative partitioning is a Postgres layout) (partitions by created_at, the primary key
// extended by created_at) rather than asserting it: the constraint idem
// needs cannot be declared, idem's own statements refuse the table, and a
// claim written the only way the table allows lets one key retried across
// midnight run twice, under every isolation level. A read before the
// insert does not save it either: two requests on either side of midnight
// both find nothing and both run, unless SERIALIZABLE's predicate locks
// happen to catch it, and idem must hold under READ COMMITTED too.
func testDailyPartitionsRunAKeyTwice(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		table, o := randName("idem_daily"), e.op()
		e.exec(`CREATE TABLE ` + table + ` (
    scope text COLLATE "C" NOT NULL, idem_key text COLLATE "C" NOT NULL,
    operation text NOT NULL, fingerprint text NOT NULL, status text NOT NULL,
    token bigint NOT NULL, lease_until timestamptz NOT NULL, created_at timestamptz NOT NULL,
    completed_at timestamptz, response_status integer, response_headers bytea, response_body bytea,
    expires_at timestamptz, sealed_key text, forget_at timestamptz, result_ref bytea,
    PRIMARY KEY (scope, idem_key, created_at)
) PARTITION BY RANGE (created_at)`)
		e.dropLater(table)
		e.exec(`CREATE TABLE ` + table + `_d1 PARTITION OF ` + table + ` FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-01-02 00:00+00')`)
		e.exec(`CREATE TABLE ` + table + `_d2 PARTITION OF ` + table + ` FOR VALUES FROM ('2026-01-02 00:00+00') TO ('2026-01-03 00:00+00')`)
		const before, after = "2026-01-01 23:59:59.9+00", "2026-01-02 00:00:00.1+00"

		// The unique constraint idem relies on cannot be declared.
		_, err := e.db.Exec(`CREATE UNIQUE INDEX ON ` + table + ` (scope, idem_key)`)
		if err == nil || !strings.Contains(err.Error(), "partition") {
			t.Fatalf("unique (scope, idem_key) on the partitioned table: err = %v, want the partition key refusal", err)
		}

		// idem's claim names that constraint, so Do fails rather than run
		// twice.
		daily, err := idem.New(idem.Postgres, idem.WithTable(table))
		must(t, err)
		s := e.onDriver(daily)
		tx := e.begin(nil)
		if _, err := s.Do(ctx, tx, charge("refused", "1"), o.fn(tx, "refused")); err == nil || !strings.Contains(err.Error(), "ON CONFLICT") || o.calls.Load() != 0 {
			t.Fatalf("Do on the daily layout: err = %v after %d executions, want no matching ON CONFLICT constraint and none", err, o.calls.Load())
		}
		must(t, tx.Rollback())

		// claim is the claim the layout allows: insert unless this exact
		// (scope, key, created_at) exists. It runs the operation when it
		// inserted, as Do would.
		claim := func(tx txn, key, at string) error {
			res, err := tx.Exec(`INSERT INTO `+table+` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES ('tenant-1', $1, 'POST /v1/charges', 'fp', 'processing', 1, $2::timestamptz + interval '30 seconds', $2)
ON CONFLICT DO NOTHING`, key, at)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 1 {
				_, err = o.fn(tx, key)(ctx)
			}
			return err
		}
		countKey := func(key string) (records, runs int64) {
			return e.int64("SELECT COUNT(*) FROM "+table+" WHERE idem_key = ?", key), int64(e.count(o.biz, key))
		}

		for _, level := range isolationLevels {
			key := "retried-" + levelName(level)
			for _, at := range []string{before, after} {
				must(t, runTx(ctx, e.db, &sql.TxOptions{Isolation: level}, func(tx txn) error { return claim(tx, key, at) }))
			}
			if records, runs := countKey(key); records != 2 || runs != 2 {
				t.Errorf("%s: a retry across midnight left %d records and ran %d times; the layout was expected to run it twice", levelName(level), records, runs)
			}
		}

		for _, level := range isolationLevels {
			key := "raced-" + levelName(level)
			opts := &sql.TxOptions{Isolation: level}
			t1, t2 := e.begin(opts), e.begin(opts)
			var errs []error
			for _, tx := range []txn{t1, t2} {
				var n int
				errs = append(errs, tx.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE scope = 'tenant-1' AND idem_key = $1", key).Scan(&n))
				if n != 0 {
					t.Fatalf("%s: a record exists before either request ran", levelName(level))
				}
			}
			errs = append(errs, claim(t1, key, before), claim(t2, key, after), t1.Commit(), t2.Commit())
			err := errors.Join(errs...)
			_, runs := countKey(key)
			switch {
			case level == sql.LevelSerializable && (runs != 1 || !idem.IsRetryable(err)):
				t.Errorf("SERIALIZABLE: %d committed runs, err = %v; want one, the other aborted by a serialization failure", runs, err)
			case level != sql.LevelSerializable && (runs != 2 || err != nil):
				t.Errorf("%s: read-then-insert on either side of midnight ran %d times (err = %v); the layout was expected to run it twice", levelName(level), runs, err)
			}
		}
	})
}
