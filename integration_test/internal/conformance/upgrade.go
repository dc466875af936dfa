package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The table every release of idem before schema versions made (schema
// version 1), verbatim, per database (facts.release1): what Migrate finds
// at a user who upgrades. It is copied here, not read from package
// schema, so that an edit of schema/*/0001_create.up.sql cannot change
// what the upgrade tests upgrade from.
const (
	release1Postgres = `CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            text COLLATE "C" NOT NULL,
    idem_key         text COLLATE "C" NOT NULL,
    operation        text NOT NULL,
    fingerprint      text NOT NULL,
    status           text NOT NULL,
    token            bigint NOT NULL,
    lease_until      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    response_status  integer,
    response_headers bytea,
    response_body    bytea,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);`
	release1MySQL = `CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            VARBINARY(255) NOT NULL,
    idem_key         VARBINARY(255) NOT NULL,
    operation        VARBINARY(255) NOT NULL,
    fingerprint      VARBINARY(128) NOT NULL,
    status           VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token            BIGINT NOT NULL,
    lease_until      DATETIME(6) NOT NULL,
    created_at       DATETIME(6) NOT NULL,
    completed_at     DATETIME(6) NULL,
    response_status  INT NULL,
    response_headers LONGBLOB NULL,
    response_body    LONGBLOB NULL,
    PRIMARY KEY (scope, idem_key),
    KEY idempotency_keys_created_at_idx (created_at)
) ENGINE=InnoDB;`
	release1TiDB = `CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            VARBINARY(255) NOT NULL,
    idem_key         VARBINARY(255) NOT NULL,
    operation        VARBINARY(255) NOT NULL,
    fingerprint      VARBINARY(128) NOT NULL,
    status           VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token            BIGINT NOT NULL,
    lease_until      DATETIME(6) NOT NULL,
    created_at       DATETIME(6) NOT NULL,
    completed_at     DATETIME(6) NULL,
    response_status  INT NULL,
    response_headers LONGBLOB NULL,
    response_body    LONGBLOB NULL,
    PRIMARY KEY (scope, idem_key) CLUSTERED,
    KEY idempotency_keys_created_at_idx (created_at)
);`
	release1SQLite = `CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            TEXT NOT NULL,
    idem_key         TEXT NOT NULL,
    operation        TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    status           TEXT NOT NULL,
    token            INTEGER NOT NULL,
    lease_until      INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    response_status  INTEGER,
    response_headers BLOB,
    response_body    BLOB,
    PRIMARY KEY (scope, idem_key)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);`
)

// createRelease1 makes table as release 1 made it, empty, dropped when the
// test ends, and returns a Store on it that has not migrated it.
func (e *env) createRelease1(opts ...idem.Option) *store {
	e.t.Helper()
	table := randName("idem")
	for _, stmt := range strings.Split(e.release1, ";\n") {
		e.exec(strings.ReplaceAll(stmt, "idempotency_keys", table))
	}
	e.dropLater(table)
	s, err := idem.New(e.dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	must(e.t, err)
	return e.onDriver(s)
}

// layout describes a table's definition (showLayout), with its name
// written T, so that two tables of one layout compare equal.
func (e *env) layout(table string) string {
	e.t.Helper()
	return strings.ReplaceAll(e.showLayout(e, table), table, "T")
}

// mysqlLayout is SHOW CREATE TABLE.
func mysqlLayout(e *env, table string) string {
	e.t.Helper()
	var name, def string
	must(e.t, e.db.QueryRow("SHOW CREATE TABLE "+table).Scan(&name, &def))
	return def
}

// sqliteLayout is the DDL SQLite keeps of the table and its indexes,
// without the quotes it keeps too.
func sqliteLayout(e *env, table string) string {
	e.t.Helper()
	var def string
	must(e.t, e.db.QueryRow(`SELECT group_concat(sql, ';') FROM (SELECT sql FROM sqlite_master WHERE tbl_name = ? ORDER BY name)`, table).Scan(&def))
	return strings.ReplaceAll(def, `"`, "")
}

// pgLayout reads the catalog: columns, indexes, storage settings (the
// table's and its TOAST table's) and comment.
func pgLayout(e *env, table string) string {
	e.t.Helper()
	var def string
	must(e.t, e.db.QueryRow(`SELECT concat_ws(' | ',
  (SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attnum)
    FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
  (SELECT string_agg(indexdef, '; ' ORDER BY indexname) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = c.relname),
  array_to_string(c.reloptions, ', '),
  'toast:' || COALESCE((SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = c.reltoastrelid), ''),
  'comment:' || COALESCE(obj_description(c.oid, 'pg_class'), ''))
FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&def))
	return def
}

// A table of release 1, holding records in every state, is upgraded in
// place by two Migrate calls at once while requests run on it, to the
// layout a new table gets; a third Migrate changes nothing. Then every old
// key is replayed: each completed one replays its stored response without
// running fn, the live claim is in flight, the released claim and the
// claim whose lease ended run once.
func TestUpgradeFromRelease1(t *testing.T) {
	const (
		seeded  = 1_000 // completed records written in bulk
		done    = 100   // completed by Do
		workers = 4     // requests on fresh keys during the upgrade
	)
	forEach(t, func(t *testing.T, e *env) {
		s, o := e.createRelease1(idem.WithRetention(time.Hour)), e.op()
		before := e.layout(s.Table())

		e.seed(s, "seeded", seeded, time.Minute, -time.Minute, "completed")
		stored := map[string]idem.Result{}
		for i := range done {
			req := charge(fmt.Sprintf("done-%d", i), "1")
			res, err := o.do(s, req)
			must(t, err)
			stored[req.Key] = res
		}
		live, dead, released := charge("live-claim", "1"), charge("dead-claim", "1"), charge("released", "1")
		e.leaveClaim(s, live, time.Hour)
		e.leaveClaim(s, dead, 0)
		c, _, err := s.Begin(ctx, e.db, released)
		must(t, err)
		must(t, c.Release(ctx, e.db))
		var old []idem.Request
		rows, err := e.db.Query(e.rebind("SELECT idem_key, operation, fingerprint FROM "+s.Table()+" WHERE scope = ?"), "seeded")
		must(t, err)
		for rows.Next() {
			req := idem.Request{Scope: "seeded"}
			must(t, rows.Scan(&req.Key, &req.Operation, &req.Fingerprint))
			old = append(old, req)
		}
		must(t, errors.Join(rows.Err(), rows.Close()))
		if len(old) != seeded {
			t.Fatalf("read %d seeded records, want %d", len(old), seeded)
		}
		for i := range done {
			old = append(old, charge(fmt.Sprintf("done-%d", i), "1"))
		}

		stopWorkers := load(workers, func(w, i int) error {
			req := charge(fmt.Sprintf("during-%d-%d", w, i), "1")
			return runTx(ctx, e.db, nil, func(tx txn) error {
				_, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
				return err
			})
		})
		var (
			migrations sync.WaitGroup
			migrated   [2]error
		)
		start := time.Now()
		for i := range migrated {
			migrations.Go(func() { migrated[i] = s.Migrate(ctx, e.db) })
		}
		migrations.Wait()
		took := time.Since(start)
		during, err := stopWorkers()
		must(t, errors.Join(append(migrated[:], err)...))
		t.Logf("upgraded %d records in %v, beside %d requests", seeded+done+3+len(during), took.Round(time.Millisecond), len(during))

		upgraded := e.layout(s.Table())
		if fresh := e.layout(e.store().Table()); upgraded != fresh {
			t.Fatalf("the upgraded table's layout is not a new table's:\nupgraded: %s\nnew:      %s\n(release 1: %s)", upgraded, fresh, before)
		}
		for _, want := range e.upgraded {
			if !strings.Contains(upgraded, want) {
				t.Errorf("the upgraded table's layout lacks %q:\n%s", want, upgraded)
			}
		}
		must(t, s.Migrate(ctx, e.db))
		if again := e.layout(s.Table()); again != upgraded {
			t.Fatalf("Migrate of an upgraded table changed it:\nbefore: %s\nafter:  %s", upgraded, again)
		}

		calls := o.calls.Load()
		replays := make(chan idem.Request)
		errs := make([]error, 8)
		var rg sync.WaitGroup
		for r := range errs {
			rg.Go(func() {
				for req := range replays {
					if errs[r] != nil {
						continue
					}
					res, err := o.do(s, req)
					want, byDo := stored[req.Key]
					switch {
					case err != nil:
						errs[r] = fmt.Errorf("replay of %s/%s: %w", req.Scope, req.Key, err)
					case !res.Replayed || res.StatusCode != 201:
						errs[r] = fmt.Errorf("replay of %s/%s: replayed=%v status %d, want a replay of 201", req.Scope, req.Key, res.Replayed, res.StatusCode)
					case byDo && !bytes.Equal(res.Body, want.Body):
						errs[r] = fmt.Errorf("replay of %s: body %q, want %q", req.Key, res.Body, want.Body)
					case !byDo && len(res.Body) != 200:
						errs[r] = fmt.Errorf("replay of %s/%s: a body of %d bytes, want the 200 stored", req.Scope, req.Key, len(res.Body))
					}
				}
			})
		}
		for _, req := range old {
			replays <- req
		}
		close(replays)
		rg.Wait()
		must(t, errors.Join(errs...))
		if n := o.calls.Load(); n != calls {
			t.Fatalf("replaying %d completed keys ran fn %d times", len(old), n-calls)
		}

		if _, err := o.do(s, live); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("the live claim after the upgrade: %v, want ErrInFlight", err)
		}
		for _, req := range []idem.Request{dead, released} {
			res, err := o.do(s, req)
			must(t, err)
			if res.Replayed {
				t.Fatalf("%s after the upgrade: a replay, want fn to run", req.Key)
			}
		}
		if n := e.int64("SELECT COUNT(*) FROM " + o.biz); n != o.calls.Load() {
			t.Fatalf("%d business rows, %d executions", n, o.calls.Load())
		}
	})
}

// Migrate leaves a table whose comment records a newer schema version
// than it knows as it is, and says nothing: a release rolled back to, or
// running beside a newer one, must not fail at its start.
func TestMigrateLeavesNewerLayout(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if e.commentSQL == nil {
			t.Skipf("%s's tables have no comment to record a version in; its table has one version so far", e.name)
		}
		s := e.createRelease1()
		e.exec(e.commentSQL(s.Table(), "idem schema 99"))
		before := e.layout(s.Table())
		must(t, s.Migrate(ctx, e.db))
		if after := e.layout(s.Table()); after != before {
			t.Fatalf("Migrate changed a table of a newer version:\nbefore: %s\nafter:  %s", before, after)
		}
		must(t, e.doOK(s, charge("newer", "1")))
	})
}

// How long the upgrade of a table of release 1 holding IDEM_UPGRADE_ROWS
// records takes, and what it holds up: 16 workers run Do on fresh keys
// before, during and after Migrate, and the test logs Migrate's duration
// and the workers' rate, p99 and slowest request in each window. It is a
// measurement, so it runs only with IDEM_UPGRADE_ROWS set;
// docs/operations.md quotes it.
func TestUpgradeUnderLoad(t *testing.T) {
	if os.Getenv("IDEM_UPGRADE_ROWS") == "" {
		t.Skip("set IDEM_UPGRADE_ROWS (e.g. 1000000) to measure the upgrade of a table that size")
	}
	rows := envInt(t, "IDEM_UPGRADE_ROWS", 0)
	const (
		workers = 16
		around  = 3 * time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		if !e.measure {
			t.Skip("measured once per server and driver family, through pgx on PostgreSQL")
		}
		if len(e.migrations) < 2 {
			t.Skipf("%s has no schema version to upgrade to", e.name)
		}
		s, o := e.createRelease1(), e.op()
		e.seed(s, "seeded", rows, time.Hour, -time.Hour, "completed")
		e.exec(e.settle + s.Table())
		stopWorkers := load(workers, func(w, i int) error {
			req := charge(fmt.Sprintf("w%d-%d", w, i), "1")
			return runTx(ctx, e.db, nil, func(tx txn) error {
				_, err := s.Do(ctx, tx, req, o.fn(tx, req.Key))
				return err
			})
		})
		time.Sleep(around)
		migStart := time.Now()
		err := s.Migrate(ctx, e.db)
		migEnd := time.Now()
		time.Sleep(around)
		all, werr := stopWorkers()
		must(t, errors.Join(err, werr))
		took := migEnd.Sub(migStart)
		t.Logf("Migrate upgraded %d records in %v (%.1f s per million) beside %d workers", rows, took.Round(time.Millisecond), took.Seconds()/float64(rows)*1e6, workers)
		for _, w := range []struct {
			name     string
			from, to time.Time
		}{{"before", migStart.Add(-around), migStart}, {"during", migStart, migEnd}, {"after", migEnd, migEnd.Add(around)}} {
			p99, n := percentile(all, w.from, w.to, 99)
			slowest, _ := percentile(all, w.from, w.to, 100)
			t.Logf("workers %s: %6d requests (%5.0f/s), p99 %v, slowest %v", w.name, n, float64(n)/w.to.Sub(w.from).Seconds(), p99.Round(100*time.Microsecond), slowest.Round(100*time.Microsecond))
		}
	})
}
