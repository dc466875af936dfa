package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// versionComment is how migrations from version 2 on record the table's
// schema version in its comment.
var versionComment = regexp.MustCompile(`\bidem schema ([0-9]+)\b`)

// MigrateOn is [Store.Migrate] on db, through any driver's adapter (a
// Runner is one: a pool works). It brings the table from the schema
// version it has to the newest this release knows, one migration at a
// time. A migration that fails may
// have lost a race with another process migrating the table: when the
// version has moved past it since, it goes on from there. A table of a
// newer version than this release knows is left as it is: each version's
// statements keep working on the tables of later versions, so that an
// older release can still run beside a newer one, or be rolled back to.
//
// A table that exists must be idem's: Migrate changes nothing in a table
// that lacks a column of idem's table (a name, given to WithTable or to
// idem's --table, of one of the application's own tables), and says so.
func (s *Store) MigrateOn(ctx context.Context, db Conn) error {
	if isNil(db) {
		return errors.New("idem: Migrate needs a database handle, got nil")
	}
	c := s.conn(db)
	steps := s.st.Migrations
	v, err := s.schemaVersion(ctx, c)
	if err != nil {
		return &Error{Op: "migrate " + s.table, Err: err, Detail: "read its schema version: " + reason(err),
			Hint: s.advice(err, "check that the database user may read the catalog, then run Migrate again (it is safe to repeat)")}
	}
	if v > 0 {
		noRows := func(func(...any) error) error { return nil }
		if err := c.queryRows(ctx, s.st.query(s.st.columns, &values{}), noRows); err != nil {
			return &Error{Op: "migrate " + s.table, Err: err, Detail: "read its columns: " + reason(err) + "; Migrate changed nothing",
				Hint: s.advice(err, "check that the database user may read the table, then run Migrate again (it is safe to repeat)")}
		}
	}
	if v == 0 && s.st.fresh != nil {
		steps = freshSteps(steps, s.st.fresh)
	}
	for v < len(steps) {
		err := s.migrateStep(ctx, c, steps[v])
		if err == nil {
			v++
			continue
		}
		now, verr := s.schemaVersion(ctx, c)
		if verr != nil || now <= v {
			return &Error{Op: "migrate " + s.table, Err: err, Detail: fmt.Sprintf("from schema version %d to %d: %s", v, v+1, reason(err)),
				Hint: s.advice(err, "check that the database user may create and alter tables and indexes, then run Migrate again (it is safe to repeat)")}
		}
		v = now
	}
	return nil
}

// migrateStep runs the statements of one migration in order, passing
// over those that have run already (Dialect.applied). Before a statement
// that builds an index beside the traffic, it waits for a build of it
// that runs (another process's Migrate), and drops it when a build of it
// failed (readyToBuild). A statement that fails with an error a retry may
// cure (two such builds on one table deadlock, and the one waiting for
// the other is chosen to fail, having built nothing) runs the step again
// from its start, after a pause, up to migrateAttempts in all: its
// statements are safe to repeat.
func (s *Store) migrateStep(ctx context.Context, c conn, stmts []string) error {
	for attempt := 1; ; attempt++ {
		err := s.runStep(ctx, c, stmts)
		if err == nil || !IsRetryable(err) {
			return err
		}
		if attempt == migrateAttempts {
			return gaveUp(attempt, err)
		}
		if perr := pause(ctx, migratePoll); perr != nil {
			return errors.Join(err, perr)
		}
	}
}

// freshSteps are the migrations steps as fresh makes their statements
// for a table Migrate creates.
func freshSteps(steps [][]string, fresh func(string) string) [][]string {
	out := make([][]string, len(steps))
	for i, stmts := range steps {
		out[i] = make([]string, len(stmts))
		for j, stmt := range stmts {
			out[i][j] = fresh(stmt)
		}
	}
	return out
}

// migrateAttempts bounds the runs of one migration step: each that fails
// lost a race with another Migrate, which is done with the step or builds
// an index the next run waits for.
const migrateAttempts = 50

// runStep runs stmts once, as migrateStep says.
func (s *Store) runStep(ctx context.Context, c conn, stmts []string) error {
	for _, stmt := range stmts {
		if s.st.builds != nil {
			if name := s.st.builds(stmt); name != "" {
				if err := s.readyToBuild(ctx, c, name); err != nil {
					return err
				}
			}
		}
		if _, err := c.exec(ctx, Query{SQL: stmt}); err != nil && !s.dialect.applied(err) {
			return err
		}
	}
	return nil
}

// retentionInMigrations is the default retention ([DefaultRetention]) as
// the migrations that give expiries to the records without one write it
// (MySQL's version 4, for its primary key): Store.Migrate runs their
// UPDATE with the Store's retention in its place, so that those records
// expire as they did, by the Store's retention. The column's default
// keeps it: it belongs to the table, whichever Store wrote a row.
const retentionInMigrations = "INTERVAL 86400000000 MICROSECOND"

// withRetention puts retention in place of the default in each UPDATE of
// migrations, for a Store of that retention.
func withRetention(migrations [][]string, retention time.Duration) [][]string {
	for _, stmts := range migrations {
		for i, stmt := range stmts {
			if strings.HasPrefix(stmt, "UPDATE ") {
				stmts[i] = strings.ReplaceAll(stmt, retentionInMigrations, fmt.Sprintf("INTERVAL %d MICROSECOND", retention.Microseconds()))
			}
		}
	}
	return migrations
}

// migratePoll is how long Migrate waits before it looks again at an index
// another process builds, or runs again a step that lost a race.
const migratePoll = 100 * time.Millisecond

// readyToBuild returns once the index name is absent or valid, or
// dropped because a build of it failed, and no build of it runs.
func (s *Store) readyToBuild(ctx context.Context, c conn, name string) error {
	for {
		var (
			valid, building bool
			qualified       string
		)
		err := c.queryRow(ctx, s.st.query(s.st.built, &values{indexName: name}), &valid, &building, &qualified)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return err
		case building:
			if err := pause(ctx, migratePoll); err != nil {
				return err
			}
		case valid:
			return nil
		default:
			_, err := c.exec(ctx, Query{SQL: s.st.dropUnbuilt + qualified})
			return err
		}
	}
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// schemaVersion reads the table's schema version: 0 when it is absent,
// the version its comment records, or 1 (a table of a release before
// versions were recorded, or of a dialect with one version so far).
func (s *Store) schemaVersion(ctx context.Context, c conn) (int, error) {
	var (
		exists  bool
		comment string
	)
	if err := c.queryRow(ctx, s.st.query(s.st.Version, &values{}), &exists, &comment); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	return commentVersion(comment), nil
}

// commentVersion is the version a table's comment records, or 1 when it
// records none.
func commentVersion(comment string) int {
	if m := versionComment.FindStringSubmatch(comment); m != nil {
		if v, err := strconv.Atoi(m[1]); err == nil && v > 1 {
			return v
		}
	}
	return 1
}

// Migrate creates the table if it is absent, and brings a table made by an
// earlier release of idem to the newest layout this release knows, with
// the migrations of package schema for the [Store]'s dialect and table
// name. It is safe to run again, and from several processes at once, and
// beside live traffic; it leaves a table of a newer layout as it is.
// docs/operations.md says what each migration locks and for how long. On
// MySQL, DDL commits any transaction open on db.
func (s *Store) Migrate(ctx context.Context, db DBTX) error {
	if isNil(db) {
		return errors.New("idem: Migrate needs a database handle, got nil")
	}
	return s.MigrateOn(ctx, sqlConn{db})
}

// advice says what to do about err, an error of a statement on the
// Store's table: about the table when the dialect reads err as one about
// it (schemaAdvice), else the fix the dialect names for err (fix), else
// otherwise. It is the Hint of the Error of every failed statement.
func (s *Store) advice(err error, otherwise string) string {
	if a := s.schemaAdvice(err); a != "" {
		return a
	}
	if fix := fixFor(err); fix != "" {
		return fix
	}
	return otherwise
}

// schemaAdvice says what to do about err, an error of a statement on the
// Store's table, when the dialect reads it as one about the table itself;
// "" when it does not.
func (s *Store) schemaAdvice(err error) string {
	fault := s.dialect.schemaFault(err)
	if errors.As(err, new(notIdem)) {
		fault = NotIdemTable
	}
	switch fault {
	case NoTable:
		return fmt.Sprintf("table %s does not exist: create it with Store.Migrate or idem migrate --table %s, or name the table idem uses (WithTable, --table)", s.table, s.table)
	case NotIdemTable:
		return fmt.Sprintf("table %s is not idem's: its columns are not those of idem's table; name the table idem uses (WithTable, --table): running this again will not help", s.table)
	case OlderTable:
		return fmt.Sprintf("table %s lacks a column of idem's table of this release: if it is idem's, of an older release, upgrade it with Store.Migrate or idem migrate --table %s (which refuses a table that is not idem's)", s.table, s.table)
	case NoSchema:
		return fmt.Sprintf("the schema of table %s does not exist: create it first (CREATE SCHEMA on PostgreSQL, CREATE DATABASE on MySQL, ATTACH DATABASE on SQLite), or name a table in a schema that exists", s.table)
	}
	return ""
}

// probed is err marked notIdem when the dialect reads it as a later
// column missing (OlderTable) and the columns probe, run on c (a handle
// outside the failed statement's transaction, whose statements after
// the error may fail), finds a column of the first version missing too;
// else err named as an error of a table of an earlier schema version
// (named).
func (s *Store) probed(ctx context.Context, c conn, err error) error {
	if s.dialect.schemaFault(err) != OlderTable {
		return err
	}
	noRows := func(func(...any) error) error { return nil }
	if perr := c.queryRows(ctx, s.st.query(s.st.columns, &values{}), noRows); perr != nil && s.dialect.schemaFault(perr) == NotIdemTable {
		return notIdem{err}
	}
	return s.named(err)
}

// named is err, an error of a statement on the Store's table, as an
// olderSchema when the dialect reads it as a column added since the
// first schema version missing (OlderTable) and nothing showed that the
// table is another's (notIdem); err itself otherwise.
func (s *Store) named(err error) error {
	if s.dialect.schemaFault(err) != OlderTable || errors.As(err, new(notIdem)) || errors.As(err, new(*olderSchema)) {
		return err
	}
	return &olderSchema{table: s.table, err: err}
}

// olderSchema is the Err of an Error of a statement on a table of an
// earlier schema version of idem's: its message names the table as such,
// before the database's own ("column expires_at does not exist"), so
// that a service that logs only err.Error() sees the cause; the Error's
// Hint says how to upgrade it. errors.Is and errors.As see through it to
// the database's error.
type olderSchema struct {
	table string
	err   error
}

func (e *olderSchema) Error() string {
	return fmt.Sprintf("table %s is of an earlier schema version of idem than this release uses (upgrade it with Store.Migrate or idem migrate): %v", e.table, e.err)
}

func (e *olderSchema) Unwrap() error { return e.err }
