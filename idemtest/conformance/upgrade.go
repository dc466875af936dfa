package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// The table every release of idem before schema versions made (schema
// version 1), verbatim, per database (facts.Release1): what Migrate finds
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
	e.needFact("Release1", e.Release1 != "")
	table := randName("idem")
	for _, stmt := range strings.Split(e.Release1, ";\n") {
		e.exec(strings.ReplaceAll(stmt, "idempotency_keys", table))
	}
	e.dropLater(table)
	s, err := idem.New(e.Dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	must(e.t, err)
	return e.onDriver(s)
}

// layout describes a table's definition (ShowLayout), with its name
// written T, so that two tables of one layout compare equal.
func (e *env) layout(table string) string {
	e.t.Helper()
	e.needFact("ShowLayout", e.ShowLayout != nil)
	def, err := e.ShowLayout(ctx, e.db.runner(nil), table)
	must(e.t, err)
	return strings.ReplaceAll(def, table, "T")
}

// mysqlLayout is SHOW CREATE TABLE.
func mysqlLayout(ctx context.Context, db idem.Conn, table string) (string, error) {
	var name, def string
	err := db.QueryRow(ctx, idem.Query{SQL: "SHOW CREATE TABLE " + table}, &name, &def)
	return def, err
}

// sqliteLayout is the DDL SQLite keeps of the table and its indexes,
// without the quotes it keeps too.
func sqliteLayout(ctx context.Context, db idem.Conn, table string) (string, error) {
	var def string
	err := db.QueryRow(ctx, idem.Query{SQL: `SELECT group_concat(sql, ';') FROM (SELECT sql FROM sqlite_master WHERE tbl_name = ? ORDER BY name)`, Args: []any{table}}, &def)
	return strings.ReplaceAll(def, `"`, ""), err
}

// pgLayout reads the catalog: columns, indexes, storage settings (the
// table's and its TOAST table's) and comment.
func pgLayout(ctx context.Context, db idem.Conn, table string) (string, error) {
	var def string
	err := db.QueryRow(ctx, idem.Query{SQL: `SELECT concat_ws(' | ',
  (SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attnum)
    FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
  (SELECT string_agg(indexdef, '; ' ORDER BY indexname) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = c.relname),
  array_to_string(c.reloptions, ', '),
  'toast:' || COALESCE((SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = c.reltoastrelid), ''),
  'comment:' || COALESCE(obj_description(c.oid, 'pg_class'), ''))
FROM pg_class c WHERE c.oid = $1::regclass`, Args: []any{table}}, &def)
	return def, err
}

// createAt makes a table of schema version v, empty, dropped when the test
// ends: release 1's (createRelease1), brought to v by the schema files of
// the versions after it. It returns a Store on it that has not migrated
// it.
func (e *env) createAt(v int, opts ...idem.Option) *store {
	e.t.Helper()
	e.needFact("Migrations", len(e.Migrations) >= v)
	s := e.createRelease1(opts...)
	for _, m := range e.Migrations[1:v] {
		for _, stmt := range strings.Split(m.SQL, ";\n") {
			if stmt = strings.TrimSpace(stmt); strings.Trim(stmt, "-+ goseUpNOTRANSACTION\n") != "" && !onlyComments(stmt) {
				e.exec(strings.ReplaceAll(stmt, "idempotency_keys", s.Table()))
			}
		}
	}
	return s
}

// onlyComments reports whether stmt holds nothing but SQL comments.
func onlyComments(stmt string) bool {
	for line := range strings.Lines(stmt) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

// hasColumns reports whether s's table has the columns.
func (e *env) hasColumns(s *store, columns ...string) bool {
	e.t.Helper()
	err := e.db.QueryRows("SELECT "+strings.Join(columns, ", ")+" FROM "+s.Table()+" WHERE 1 = 0", nil,
		func(func(dest ...any) error) error { return nil })
	return err == nil
}

// requestOf is the request that wrote the record of scope and key.
func (e *env) requestOf(s *store, scope, key string) idem.Request {
	e.t.Helper()
	req := idem.Request{Scope: scope, Key: key}
	must(e.t, e.db.QueryRow(e.rebind("SELECT operation, fingerprint FROM "+s.Table()+" WHERE scope = ? AND idem_key = ?"), scope, key).Scan(&req.Operation, &req.Fingerprint))
	return req
}

// olderWrites is a worker's call of load that writes what a request of the
// release before does beside an upgrade: one completed record of the
// older layout, key k-i of scope "during-w", by set-based SQL (the code of
// this release cannot write the older layout).
func (e *env) olderWrites(s *store) func(w, i int) error {
	e.needFact("SeedRecords", e.SeedRecords != nil)
	return func(w, i int) error {
		q, args := e.SeedRecords(idemtest.Records{Scope: fmt.Sprintf("during-%d", w), Status: "completed", From: i, To: i + 1, Ago: 0, Lease: -time.Second}, s.Table())
		// Retried as its release's RunTx would: Galera runs ALTER TABLE in
		// total order, aborting the writes in flight on the table (error
		// 1213) where InnoDB's online DDL lets them finish.
		return idem.Retry(ctx, func() error {
			_, err := e.db.Exec(q, args...)
			return err
		})
	}
}

// A table of each earlier schema version (release 1's, and the version
// before this release's), holding records in every state its release
// wrote, is upgraded in place by two Migrate calls at once while the
// release before writes to it, to the layout a new table gets; a third
// Migrate changes nothing. Before, this release's requests on it fail
// with the advice to migrate, and run nothing. After, every old key is
// replayed: each completed one replays its stored response without
// running fn, the live claim is in flight, the claim whose lease ended
// runs once; the old records expire by the Store's retention, as they did.
func testUpgradeFromEarlierVersions(t *testing.T) {
	const (
		seeded  = 1_000 // completed records written in bulk
		workers = 4     // the release before's writes during the upgrade
	)
	forEach(t, func(t *testing.T, e *env) {
		if e.HeavyWrites != "" {
			t.Skip(e.HeavyWrites)
		}
		versions := []int{1}
		if v := len(e.Migrations) - 1; v > 1 {
			versions = append(versions, v)
		}
		for _, v := range versions {
			t.Run(fmt.Sprintf("from-v%d", v), func(t *testing.T) {
				e := e.in(t)
				s, o := e.createAt(v, idem.WithRetention(time.Hour)), e.op()
				before := e.layout(s.Table())

				e.seedOlder(s, "seeded", seeded, time.Minute, -time.Minute, "completed")
				e.seedOlder(s, "live-claim", 1, 0, time.Hour, "processing")
				e.seedOlder(s, "dead-claim", 1, time.Minute, -time.Second, "processing")
				live, dead := e.requestOf(s, "live-claim", "k-0"), e.requestOf(s, "dead-claim", "k-0")
				// The seed gives the records an expiry where the table's
				// primary key needs one (MySQL's version 4): its column's
				// default, by the default retention.
				seededExpiry := e.hasColumns(s, "expires_at") && e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE scope = 'seeded' AND expires_at IS NOT NULL") > 0
				// A table of a version before the columns this release
				// writes refuses its requests, with the advice to migrate;
				// one that has them (MySQL's version 3, which version 4
				// clusters anew) serves them.
				tx := e.begin(nil)
				_, err := s.Do(ctx, tx, charge("before-migrate", "1"), o.fn(tx, "before-migrate"))
				must(t, tx.Rollback())
				if e.hasColumns(s, "expires_at", "sealed_key", "forget_at", "result_ref") {
					if err != nil || o.calls.Load() != 1 {
						t.Fatalf("Do on a table of version %d, which has every column, before Migrate: %v after %d executions; want one", v, err, o.calls.Load())
					}
					o.calls.Store(0)
				} else if !strings.Contains(told(err), "upgrade it with Store.Migrate") || o.calls.Load() != 0 {
					t.Fatalf("Do on a table of version %d before Migrate: %v after %d executions; want the advice to migrate and none", v, err, o.calls.Load())
				}

				stopWorkers := load(workers, e.olderWrites(s))
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
				t.Logf("upgraded %d records in %v, beside %d writes of the release before", seeded+2+len(during), took.Round(time.Millisecond), len(during))

				upgraded := e.layout(s.Table())
				if fresh := e.layout(e.store().Table()); upgraded != fresh {
					t.Fatalf("the upgraded table's layout is not a new table's:\nupgraded: %s\nnew:      %s\n(version %d: %s)", upgraded, fresh, v, before)
				}
				for _, want := range e.Upgraded {
					if !strings.Contains(upgraded, want) {
						t.Errorf("the upgraded table's layout lacks %q:\n%s", want, upgraded)
					}
				}
				must(t, s.Migrate(ctx, e.db))
				if again := e.layout(s.Table()); again != upgraded {
					t.Fatalf("Migrate of an upgraded table changed it:\nbefore: %s\nafter:  %s", upgraded, again)
				}

				var old []idem.Request
				must(t, e.db.QueryRows("SELECT scope, idem_key, operation, fingerprint FROM "+s.Table()+" WHERE status = 'completed'", nil, func(scan func(dest ...any) error) error {
					var req idem.Request
					err := scan(&req.Scope, &req.Key, &req.Operation, &req.Fingerprint)
					old = append(old, req)
					return err
				}))
				if want := seeded + len(during); len(old) != want {
					t.Fatalf("read %d completed records, want %d", len(old), want)
				}
				replays := make(chan idem.Request)
				errs := make([]error, 8)
				var rg sync.WaitGroup
				for r := range errs {
					rg.Go(func() {
						for req := range replays {
							if errs[r] != nil {
								continue
							}
							switch res, err := o.do(s, req); {
							case err != nil:
								errs[r] = fmt.Errorf("replay of %s/%s: %w", req.Scope, req.Key, err)
							case !res.Replayed || res.StatusCode != 201 || len(res.Body) != 200:
								errs[r] = fmt.Errorf("replay of %s/%s: replayed=%v status %d, %d bytes; want a replay of the 201 and its 200 bytes stored", req.Scope, req.Key, res.Replayed, res.StatusCode, len(res.Body))
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
				if n := o.calls.Load(); n != 0 {
					t.Fatalf("replaying %d completed keys ran fn %d times", len(old), n)
				}

				if _, err := o.do(s, live); !errors.Is(err, idem.ErrInFlight) {
					t.Fatalf("the live claim after the upgrade: %v, want ErrInFlight", err)
				}
				res, err := o.do(s, dead)
				must(t, err)
				if res.Replayed {
					t.Fatalf("the claim whose lease ended, after the upgrade: a replay, want fn to run")
				}
				if n := e.int64("SELECT COUNT(*) FROM " + o.biz); n != 1 || o.calls.Load() != 1 {
					t.Fatalf("%d business rows, %d executions; want the dead claim's one", n, o.calls.Load())
				}

				// The old records expire by the Store's retention: an hour
				// after they were created; those seeded with an expiry, by
				// theirs.
				past := 2 * time.Hour
				if seededExpiry {
					past = idem.DefaultRetention + time.Hour
				}
				e.age(s, "k-1", past)
				if _, err := o.do(s, e.requestOf(s, "seeded", "k-1")); err != nil || o.calls.Load() != 2 {
					t.Fatalf("an old record past the Store's retention: %v after %d executions, want it to run again", err, o.calls.Load())
				}
			})
		}
	})
}

// A build of an index beside the traffic that failed (a process killed,
// a deadlock with another Migrate's) leaves the index in the catalog,
// unusable, and CREATE INDEX CONCURRENTLY IF NOT EXISTS would pass over
// it: Migrate drops it and builds it. The failed build here is a unique
// index of the name on a column with duplicates, as PostgreSQL leaves it.
func testMigrateRebuildsAFailedIndexBuild(t *testing.T) {
	forDialect(t, idem.Postgres, func(t *testing.T, e *env) {
		s := e.createAt(2) // the version before the one that builds the expires_at index
		e.seedOlder(s, "seeded", 10, time.Minute, -time.Minute, "completed")
		index := strings.Trim(s.Table(), `"`) + "_expires_at_idx"
		if _, err := e.db.Exec("CREATE UNIQUE INDEX CONCURRENTLY " + index + " ON " + s.Table() + " (status)"); err == nil {
			t.Fatal("a unique index on the status of ten completed records was built")
		}
		if valid := e.int64("SELECT COUNT(*) FROM pg_index WHERE indexrelid = to_regclass($1) AND indisvalid", index); valid != 0 {
			t.Fatalf("the failed build left a valid index")
		}
		must(t, s.Migrate(ctx, e.db))
		if got, want := e.layout(s.Table()), e.layout(e.store().Table()); got != want {
			t.Fatalf("after Migrate:\n%s\nwant a new table's:\n%s", got, want)
		}
	})
}

// Migrate leaves a table whose comment records a newer schema version
// than it knows as it is, and says nothing: a release rolled back to, or
// running beside a newer one, must not fail at its start.
func testMigrateLeavesNewerLayout(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if e.CommentSQL == nil {
			t.Skipf("%s's tables have no comment to record a version in; its table has one version so far", e.Name)
		}
		s := e.store() // today's layout, as a newer release's would hold its columns
		e.exec(e.CommentSQL(s.Table(), "idem schema 99"))
		before := e.layout(s.Table())
		must(t, s.Migrate(ctx, e.db))
		if after := e.layout(s.Table()); after != before {
			t.Fatalf("Migrate changed a table of a newer version:\nbefore: %s\nafter:  %s", before, after)
		}
		must(t, e.doOK(s, charge("newer", "1")))
	})
}

// How long the upgrade of a table of release 1 holding IDEM_UPGRADE_ROWS
// records takes, and what it holds up: 16 workers write as the release
// before does (olderWrites) before, during and after Migrate, and the test logs Migrate's duration
// and the workers' rate, p99 and slowest request in each window.
// IDEM_UPGRADE_FROM=previous upgrades a table of the version before the
// newest instead, to measure the newest step alone. It is a
// measurement, so it runs only with IDEM_UPGRADE_ROWS set;
// docs/operations.md quotes it.
func testUpgradeUnderLoad(t *testing.T) {
	if os.Getenv("IDEM_UPGRADE_ROWS") == "" {
		t.Skip("set IDEM_UPGRADE_ROWS (e.g. 1000000) to measure the upgrade of a table that size")
	}
	rows := envInt(t, "IDEM_UPGRADE_ROWS", 0)
	const (
		workers = 16
		around  = 3 * time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		if !e.Measure {
			t.Skip("measured once per server and driver family, through pgx on PostgreSQL")
		}
		if len(e.Migrations) < 2 {
			t.Skipf("%s has no schema version to upgrade to", e.Name)
		}
		from := 1
		switch f := os.Getenv("IDEM_UPGRADE_FROM"); f {
		case "", "1":
		case "previous":
			from = len(e.Migrations) - 1
		default:
			t.Fatalf("IDEM_UPGRADE_FROM=%q: want 1 or previous", f)
		}
		s := e.createAt(from)
		e.seedOlder(s, "seeded", rows, time.Hour, -time.Hour, "completed")
		e.exec(e.Settle + s.Table())
		stopWorkers := load(workers, e.olderWrites(s))
		time.Sleep(around)
		migStart := time.Now()
		err := s.Migrate(ctx, e.db)
		migEnd := time.Now()
		time.Sleep(around)
		all, werr := stopWorkers()
		must(t, errors.Join(err, werr))
		took := migEnd.Sub(migStart)
		t.Logf("Migrate upgraded %d records from version %d in %v (%.1f s per million) beside %d workers", rows, from, took.Round(time.Millisecond), took.Seconds()/float64(rows)*1e6, workers)
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
