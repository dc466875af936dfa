package idem

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/idemkit/idem/schema"
)

// Dialect adapts idem to one database family: the SQL it runs, whole, and
// how it reads the driver's errors. idem's own are [Postgres], [MySQL],
// [MariaDB], [TiDB] and [SQLite]; [NewDialect] builds one from a
// [DialectSpec], as it builds idem's own. The interface is sealed so that
// it can grow without breaking anyone: a Dialect is a value NewDialect
// returned.
//
// Adding a database is a DialectSpec (its statements and how it reads its
// driver's errors) and its schema: docs/dialects.md lists the places.
type Dialect interface {
	// Name is the dialect's name: "postgres", "mysql", "mariadb", "tidb"
	// or "sqlite" for idem's own.
	Name() string

	// statements returns the statements for a validated, possibly
	// schema-qualified table name: see [statements].
	statements(parts []string) *statements
	// inserted reads the outcome of an insert statement, run with exec: n
	// rows changed, or err. It is true when the row was inserted, false
	// when the key already had one.
	inserted(n int64, err error) (bool, error)
	// retryable reports a serialization failure, deadlock or lock timeout.
	retryable(err error) bool
	// fix names what to change for an error of its drivers where the
	// hint of idem's errors (a missing permission, a retry) would send
	// the user the wrong way (a pooler that lost the driver's prepared
	// statements), or returns "".
	fix(err error) string
	// literals returns the function that writes a statement's arguments
	// into its text, for the statements idem sends through c, where the
	// driver behind c then sends each in fewer round trips (MySQL;
	// PostgreSQL through lib/pq); nil where they go with parameters. It
	// is asked once per handle, not per statement.
	literals(c Conn) func(q Query) Query
	// applied reports an error of a migration's statement that says it has
	// run already (a column or index that exists, or one to drop that does
	// not): a migration that failed part way, or that another process ran
	// meanwhile, is run again from its start, and goes on past it.
	applied(err error) bool
	// schemaFault reads an error of the database as one about the table a
	// statement named (it does not exist, its columns are not those of
	// idem's table, its schema does not exist), or NoSchemaFault.
	schemaFault(err error) SchemaFault
	// checkSession refuses, before the claim, a transaction in a mode
	// where a duplicate would not wait for the claim (TiDB's optimistic
	// transactions), with an error that names the setting and how to
	// change it. Where no mode is unsafe it runs no statement and returns
	// nil. c is the handle's Conn as its driver's adapter gave it: the
	// reads of checkSession and causalReads take no arguments, so no
	// dialect writes them into the text (literals), and the Store does
	// not wrap c for them on every claim.
	checkSession(ctx context.Context, c Conn) error
	// causalReads refuses a session whose transactions may begin before
	// its node has applied what the database acknowledged elsewhere (a
	// Galera node without wsrep_sync_wait), where a Claim made on one node
	// and completed on another would not find itself: a Claim's fenced
	// statement that changed nothing asks before it says why (Begin's
	// claim statement refuses such a session itself, as MySQL's
	// galeraCausalGuard does, at no statement's cost). It names the setting and how to change it.
	// Where every read sees what was acknowledged it runs no statement
	// and returns nil.
	causalReads(ctx context.Context, c Conn) error
	// lockWaiter returns how the dialect bounds a lock wait inside a
	// transaction, for WithLockTimeout, or nil where it cannot (SQLite: a
	// duplicate waits at BEGIN IMMEDIATE, before idem runs).
	lockWaiter() lockWaiter
	// claimGone returns, for a dialect whose Do can send its statements in
	// fewer round trips through a Pipeline (PostgreSQL's, on pgx), how to
	// read completeLast's failure when the claim it completes is gone;
	// its statements then have readAfterClaim and completeLast. nil where
	// Do does not pipeline.
	claimGone() func(err error) bool
}

// lockWaiter runs fn with every lock wait of c's session bounded by d,
// and leaves the session's own bound as it found it. timedOut reports
// that fn failed because a wait ran out; c is then usable, with nothing
// fn did in it.
type lockWaiter func(ctx context.Context, c Conn, d time.Duration, fn func() error) (timedOut bool, err error)

// DefaultTable is the table of a Store that [WithTable] does not name
// another.
const DefaultTable = "idempotency_keys"

// parseTable splits a table name into its identifier parts, or explains
// why it is not one.
func parseTable(name string) ([]string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("idem: table name %q: at most one dot (schema.table)", name)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("idem: table name %q: %w", name, err)
		}
	}
	return parts, nil
}

// maxIdentLen leaves room for the suffix of the index name within
// Postgres's 63-byte limit, so no name is ever truncated.
const maxIdentLen = 48

func checkIdent(p string) error {
	if p == "" {
		return fmt.Errorf("empty identifier")
	}
	if len(p) > maxIdentLen {
		return fmt.Errorf("identifier %q is %d bytes, at most %d allowed", p, len(p), maxIdentLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		ok := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
		if !ok {
			return fmt.Errorf("identifier %q: only letters, digits and underscores, not starting with a digit", p)
		}
	}
	return nil
}

// base is the table's own name, without its schema: the prefix of its
// indexes' names.
func (s *statements) base() string { return s.parts[len(s.parts)-1] }

// schema is the table's schema: the one it was named with, else the
// Statements' Schema.
func (s *statements) schema() any {
	if len(s.parts) == 2 {
		return s.parts[0]
	}
	return s.Schema
}

// Statements are a dialect's statements for one table, as data: each
// statement's text, whole, with the table's name in it, and what it takes
// in place of each placeholder ([Arg]). Times come from the database
// clock; durations are in microseconds. The statements that change a
// claim after it was made (Complete, Extend, Release, Remove,
// ResealWrite) are fenced: they change the record only while it is the
// claim with the given token, and then always change a column, so that a
// database that counts changed rows reports the match. Every Statement is
// required but Claimed; idem's own ([StatementsOf]) show what each
// returns, in which order. idem's engine reads these very fields: its
// dialects' statements are a Statements and what only they have.
type Statements struct {
	// Quoted is the table's whole name, quoted as the statements name it.
	Quoted string
	// Schema is the schema of a table named without one, as ArgSchema
	// gives it: nil for the connection's.
	Schema any
	// Migrations is the DDL of each schema version, in order: the
	// statements at index i bring a table of version i (0: absent) to
	// version i+1. Each is safe to run again once it has run, or fails
	// without changing anything.
	Migrations [][]string
	// Version reads whether the table exists (a boolean) and its comment,
	// in which the migrations from version 2 on record the version.
	Version Statement
	// Insert claims a new key as PROCESSING with a token from the
	// database clock (Begin's claim), its lease, and its expiry (the lease
	// and the request's retention from now), or does nothing (or fails
	// with a duplicate-key error that Inserted reads as false) when it
	// exists. It waits for an open transaction that holds the key. What
	// it returns, InsertReturns says.
	Insert Statement
	// InsertOwn is Insert with the claim's token given (ArgToken: Do's)
	// instead of one from the clock. It returns nothing.
	InsertOwn Statement
	// InsertDone is InsertOwn of a record completed in the same statement
	// (Apply's claim, whose response is known before fn runs): its
	// response status, header, body and sealed_key stored, completed_at
	// the claim's time, forget_at its expiry plus the request's key
	// memory (ArgMemory). It returns nothing.
	InsertDone Statement
	// Takeover makes the record a new PROCESSING claim (with its lease and
	// expiry, as Insert's) and grows its token, if the token is still the
	// one read and the record may still be taken over (released, lease
	// ended, or forgotten) as the statement sees it: a Complete or Extend
	// that committed between the Read and this write wins. What it
	// returns, TakeoverReturns says.
	Takeover Statement
	// InsertReturns and TakeoverReturns are what Insert and Takeover
	// return when they claim.
	InsertReturns, TakeoverReturns Returning
	// Claimed reads the token of the claim the transaction has just made,
	// and how long ago, in µs, its claim statement started: what the claim
	// statements do not return. Empty where they return both.
	Claimed Statement
	// Read reads a record: operation, fingerprint, status, token,
	// forgotten (past its expiry, and for a completed one past its forget
	// time, forget_at, or where it has none past the Store's key memory
	// after its expiry: the key counts as absent), expired (its response
	// is gone: past its expiry, or kept by the key memory), lease left in
	// µs, response status, header, body and sealed_key. It sees the latest
	// committed row whatever the transaction's snapshot (on MySQL a
	// locking read).
	Read Statement
	// ReadCompleted is Read of a record that is completed and within its
	// expiry, and of what its replay needs: operation, fingerprint,
	// response status, header, body and sealed_key, then the time left
	// until its expiry by the database clock, in µs (for the replay
	// cache's deadline). Any other record is no row. It sees and locks
	// what Read does.
	ReadCompleted Statement
	// State reads a record's status and token as last committed, to
	// explain why a fenced statement changed nothing.
	State Statement
	// Complete stores the final response of the claim, and sets its
	// expiry to the request's retention from now (a Claim's), or leaves it
	// as it was when that is NULL (Do's, whose claim counted the retention
	// from the claim: so its update changes no indexed column), and its
	// forget time (forget_at, unindexed) to that expiry plus the request's
	// key memory (ArgMemory). Fenced.
	Complete Statement
	// Extend moves the lease's end to at least lease from now, and at
	// least one microsecond later than it was. Fenced. It leaves the
	// expiry as Begin set it (no purge takes a claim whose lease is live,
	// and Complete moves the expiry where the completion needs it), so
	// that it changes no indexed column: on MySQL's schema version 4 a
	// new expiry moves the record, and heartbeats of neighbouring keys at
	// once deadlocked.
	Extend Statement
	// Release ends the claim without a result: the next attempt takes the
	// record over at once. Fenced.
	Release Statement
	// Remove deletes Do's claim after fn failed: the PROCESSING claim,
	// or Apply's, completed by its claim statement. Fenced on the token
	// alone, which no other claim of the key has.
	Remove Statement
	// PurgeWindow reads what Purge and Strip (with the same cursor and
	// limit) would change, locking nothing: how many records have expired
	// (expires_at at the cursor, in µs since the Unix epoch, or later, and
	// not later than now), at most limit of them, the expires_at of the
	// last (latest) of them, in µs (0 when none), and how many of them
	// Strip would make tombstones: a batch whose window has none runs no
	// Strip (on MariaDB its scan of a window of 100,000 records without
	// one took 0.37 s, beside the DELETE's 0.4 s).
	PurgeWindow Statement
	// Purge deletes at most limit of those records, oldest expiry first,
	// but for the completed ones whose forget time (forget_at; where it is
	// NULL, the expiry plus the Store's key memory) is ahead, which Strip
	// keeps, and never a live claim; where the database can, it passes over rows that
	// another transaction holds instead of waiting for them.
	Purge Statement
	// Strip makes tombstones of at most limit of those records, up to the
	// window's last expiry (ArgTo), that are completed and whose forget
	// time is ahead: status 'expired', no response, their expiry moved to
	// their forget time. It passes over held rows as Purge does.
	Strip Statement
	// LegacyWindow and LegacyPurge are PurgeWindow (without the count of
	// tombstones: none is made of these) and Purge (delete) of
	// the records written before the schema version with expires_at (it is
	// NULL on them), which expire as they did then, by the Store's
	// retention and the key memory, in created_at order from the legacy
	// cursor.
	LegacyWindow, LegacyPurge Statement
	// PurgeIsolation is the isolation level of the short transaction each
	// purge batch runs in.
	PurgeIsolation sql.IsolationLevel
	// ResealRead reads, for ResealBatchOn, at most limit completed
	// records not yet past their expiry whose response is not sealed with
	// the key given, in expires_at order from the cursor, and locks them:
	// scope, key, operation, token, expires_at (µs), sealed_key, header
	// and body.
	ResealRead Statement
	// ResealLeft counts the records ResealRead would read from the
	// start, for ResealLeftOn.
	ResealLeft Statement
	// ResealWrite stores a record's response sealed anew. Fenced on the
	// token and the status.
	ResealWrite Statement
	// Inspect reads a record for a person: operation, fingerprint, status,
	// token, lease_until, created_at and completed_at (µs since the Unix
	// epoch; completed_at may be NULL), the database clock (µs), forgotten,
	// expired, its expiry (µs), response status, header, body and
	// sealed_key. A plain read that locks nothing.
	Inspect Statement
	// InspectKey reads the records of key in every scope, in scope order,
	// at most limit of them: scope, then what Inspect reads. The table is
	// indexed by (scope, key), so this reads all of it. A plain read that
	// locks nothing.
	InspectKey Statement
	// Stats counts the records per status: status, count, oldest
	// created_at (µs since the Unix epoch), how many are past their
	// expiry (what Purge would delete, or Strip under a key memory), and
	// the database clock (µs).
	Stats Statement
	// Size reads the bytes of the table and of its indexes (NULL where the
	// database cannot tell).
	Size Statement
	// NoReplicationWait says what the database offers instead of waiting
	// for its replicas, for [Store.WaitReplicated]'s error.
	NoReplicationWait string
}

// statements are a dialect's statements for one table, as the engine
// reads them: its [Statements] (above, where each is described),
// the ones only idem's own dialects have, and the table they are for.
// The statements that change a claim after it was made are fenced: one
// that ran after its transaction ended, or after another request took
// the key, changes nothing.
type statements struct {
	// Statements are the statements a DialectSpec gives too
	// (dialectspec.go).
	Statements
	// built reads the state of an index of the table (ArgQuoted, and
	// ArgIndexName, its name as a migration creates it): whether it is
	// valid, whether a build of it is running, and its name as
	// dropUnbuilt takes it; no row when it does not exist. Empty where an
	// index is built whole or not at all; else builds says which
	// statements of a migration build one beside the traffic
	// (PostgreSQL's CREATE INDEX CONCURRENTLY), and migrateStep reads
	// built before each: such a build that failed (a deadlock with
	// another Migrate's, a process killed) leaves its index unusable,
	// and IF NOT EXISTS would pass over it for ever.
	built Statement
	// builds is the name of the index stmt builds beside the traffic, or
	// "".
	builds func(stmt string) string
	// dropUnbuilt is the text before the name of such an index that
	// drops it, without holding up the traffic.
	dropUnbuilt string
	// fresh is a migration's statement as Migrate runs it on a table it
	// has just created, which no traffic uses yet: an index built or
	// dropped beside the traffic (CONCURRENTLY, which waits for every
	// transaction older than it in the whole database) is built or
	// dropped plainly. nil where the statements are the same.
	fresh func(stmt string) string
	// readAfterClaim is Read, sent in one round trip right after Do's
	// claim (a Pipeline's batch), for when the claim finds the record: a
	// statement of its own, so that under READ COMMITTED it sees what a
	// transaction that held the key committed while the claim waited for
	// it. Under REPEATABLE READ and SERIALIZABLE it reads no row, and
	// scans nothing (no predicate lock): there the claim fails when a
	// holder committed after the snapshot, and Read runs on its own after
	// a claim that found the record, as without a Pipeline. It reads the
	// claim's own record too when the claim succeeded, which Do then
	// discards. Empty where the dialect's claimGone is nil.
	readAfterClaim Statement
	// readFirstWhenReplaying: ReadCompleted of a key that has no record
	// locks nothing (no gap lock that a concurrent claim of another key
	// could deadlock on), so take reads a key it does not know first while
	// most such keys are replays (completed.replaysMostly); and it waits
	// for no transaction that holds the key, so with WithLockTimeout
	// acquire reads first before the bound (a plain read, as PostgreSQL's).
	readFirstWhenReplaying bool
	// completeLast is Do's Complete, for a completion sent in one round
	// trip with the COMMIT after it (a Pipeline's Defer): it fails when it
	// changes no record (the claim is gone), so that the COMMIT does not
	// run, where Complete reports that as no row changed, too late to
	// stop it; claimGone reads that failure. Empty where the dialect's
	// claimGone is nil.
	completeLast Statement
	// purgeHeld and stripHeld are Purge and Strip that pass over the rows
	// another transaction holds, for a dialect whose Purge and Strip wait
	// for them (MySQL's, whose DELETE and UPDATE cannot skip a locked
	// row, and whose statements that can are slower): a batch runs Purge
	// and Strip with lock waits bounded to nothing (its lockWaiter), and
	// these after a wait ran out. Empty elsewhere.
	purgeHeld, stripHeld Statement
	// purgeStart reads, locking nothing, the expiry (µs) of the first
	// record PurgeWindow would count from the cursor on, 0 when there is
	// none: where a sweep's first window starts, for a dialect whose
	// window reads are bounded ahead (TiDB's): then PurgeWindow reads up
	// to before ArgUpto only, and returns the database clock (µs) last,
	// and Purge and Strip change nothing past ArgTo, the window's last
	// expiry. Empty where a window reads from the cursor to now (the
	// statements take no ArgUpto, and none but Strip ArgTo). legacyStart is the same for
	// the records without an expiry, by created_at.
	purgeStart, legacyStart Statement
	// columns reads no row but names every column of idem's table, so that
	// on a table that is not idem's it fails with an error schemaFault
	// reads as NotIdemTable.
	columns Statement
	// replicated reads, on a pool outside any transaction, the primary's
	// WAL position now (the end of what it has committed), in bytes as a
	// decimal and as a person reads it, how many physical streaming
	// standbys have flushed WAL up to it, and whether the role may read
	// their positions: WaitReplicated's first read. flushed reads the
	// position, in bytes as a decimal, that each physical streaming
	// standby has flushed, one a row: the reads while it waits, which
	// every wait on a handle shares. Both empty where the dialect cannot
	// wait for its replicas; then NoReplicationWait says what the
	// database offers instead.
	replicated, flushed Statement
	// parts is the name of the table they are for: one part, or a schema
	// and the table. Its quoted name and the schema of a name without one
	// are the Statements' Quoted and Schema.
	parts []string
}

// Statement is one statement of a dialect's, whole, with what it takes
// in place of each of its placeholders, in order.
type Statement struct {
	// SQL is the statement's text, with the table's name in it and the
	// database's placeholders ("?" or "$1").
	SQL string
	// Args is what each placeholder takes, in order.
	Args []Arg
}

// Returning is what a claim statement (Statements' Insert and Takeover)
// returns when it claims: Token, the claim's token; and Lag, after the
// token, how long after the statement's start the claim was granted, in
// µs. A claim statement that returns neither reports the claim by the
// rows it changed, and Statements' Claimed reads them.
type Returning struct{ Token, Lag bool }

// Arg is what a statement takes in place of one placeholder. Durations
// are in microseconds, times in microseconds since the Unix epoch.
type Arg uint8

const (
	ArgScope       Arg = iota // the request's
	ArgKey                    // the request's
	ArgOperation              // the request's
	ArgFingerprint            // the request's
	ArgToken                  // the claim's fencing token
	ArgLease                  // a lease, in µs
	ArgRetention              // the Store's retention, in µs (a record without an expiry expires by it)
	ArgKeep                   // the request's retention, in µs; complete's is NULL for Do's claim, whose expiry stays
	ArgExpiry                 // a new claim's expiry from now, in µs: its lease and the request's retention
	ArgKeyMemory              // the Store's key memory, in µs (0: none): a record without a forget time of its own keeps its key this long past its expiry
	ArgMemory                 // the request's key memory, in µs: its own, else the Store's (0: none); a completion sets the forget time by it
	ArgSealedKey              // the name of the key that sealed the response, NULL in the clear
	ArgStatus                 // the response's status code
	ArgHeader                 // the response's header, encoded
	ArgBody                   // the response's body
	ArgRef                    // the response's reference, encoded; NULL when it has none
	ArgFrom                   // a cursor: µs since the Unix epoch
	ArgUpto                   // where a window's read ahead stops, before it: µs since the Unix epoch
	ArgTo                     // a window's last expiry (or created_at), which its batch's statements stop at: µs since the Unix epoch
	ArgLimit                  // at most this many records
	ArgSchema                 // the table's schema; NULL for the connection's
	ArgBase                   // the table's own name
	ArgQuoted                 // the table's whole name, quoted
	ArgIndex                  // the name of the table's expires_at index
	ArgIndexName              // the name of an index a migration builds
	argEnd                    // no Arg: the number of them
)

// rendered returns s for the table named by parts, quoted as quoted, whose
// schema when parts names none is schemaName: with its name in every
// statement's text and every migration, in place of the template's.
func (s *statements) rendered(parts []string, quoted string, schemaName any, ddl []schema.Migration) *statements {
	s.parts, s.Quoted, s.Schema = parts, quoted, schemaName
	s.Migrations = migrationStatements(ddl, quoted, s.base())
	for _, st := range s.all() {
		st.SQL = render(st.SQL, quoted, s.base())
	}
	return s
}

// all is every statement of s: each field of type Statement, its own and
// its Statements', found by reflection so that a statement added to
// either struct cannot be left out of rendering or of the tests.
func (s *statements) all() []*Statement {
	return fieldsOf[Statement](reflect.ValueOf(&s.Statements).Elem(), fieldsOf[Statement](reflect.ValueOf(s).Elem(), nil))
}

// fieldsOf appends to all a pointer to each field of type T of v, a
// struct that is addressable.
func fieldsOf[T any](v reflect.Value, all []*T) []*T {
	for i := range v.NumField() {
		if f := v.Field(i); f.Type() == reflect.TypeFor[T]() {
			all = append(all, (*T)(f.Addr().UnsafePointer()))
		}
	}
	return all
}

// args lists a statement's arguments in order.
func args(a ...Arg) []Arg { return a }

// SchemaFault is what an error of the database says is wrong with the
// table a statement named, as a [DialectSpec]'s SchemaFault reads it.
type SchemaFault int

const (
	NoSchemaFault SchemaFault = iota // the error is not about the table
	NoTable                          // the table does not exist
	NotIdemTable                     // a column of idem's table is missing, or of another type: the table is someone else's
	OlderTable                       // a column added since the first schema version (expires_at, sealed_key, forget_at, result_ref) is missing: the table is idem's, of an older release
	NoSchema                         // the table's schema does not exist (MySQL: its database; SQLite: the attached database)
)

// laterColumns are the columns of idem's table added after its first
// schema version: an error naming one of them as missing is about a table
// of an older release (OlderTable), not another's.
var laterColumns = []string{"expires_at", "sealed_key", "forget_at", "result_ref"}

// missingFault is the schemaFault of a database's error that a column is
// missing, msg its text: OlderTable when it names one of laterColumns,
// NotIdemTable otherwise.
func missingFault(msg string) SchemaFault {
	for _, c := range laterColumns {
		if strings.Contains(msg, c) {
			return OlderTable
		}
	}
	return NotIdemTable
}

// notIdem marks an error of a statement on a table that lacks a column of
// idem's first schema version, as probed found: a table of an older
// release lacks only laterColumns.
type notIdem struct{ error }

func (e notIdem) Unwrap() error { return e.error }

// columnsProbe is every dialect's columns statement: it names each column
// that idem's table has had since its first schema version, and reads no
// row.
var columnsProbe = Statement{SQL: columnsProbeSQL}

const columnsProbeSQL = `SELECT scope, idem_key, operation, fingerprint, status, token, lease_until, created_at,
  completed_at, response_status, response_headers, response_body FROM idempotency_keys WHERE 1 = 0`

// templateTable is the table the statements and schema/*/*.sql are written
// for; render puts the Store's own in its place.
const templateTable = "idempotency_keys"

// templateNames matches templateTable and the names made from it (its
// indexes'), as words.
var templateNames = regexp.MustCompile(`\b` + templateTable + `\w*`)

// render puts a quoted table name, and the table's own (unqualified) name
// as the prefix of its index names, into a statement or DDL written for
// templateTable, in one pass.
func render(sql, quoted, base string) string {
	return templateNames.ReplaceAllStringFunc(sql, func(name string) string {
		if name == templateTable {
			return quoted
		}
		return base + strings.TrimPrefix(name, templateTable)
	})
}

// migrationStatements renders a dialect's migrations for a table, each
// split into its statements.
func migrationStatements(ms []schema.Migration, quoted, base string) [][]string {
	steps := make([][]string, len(ms))
	for i, m := range ms {
		steps[i] = schemaStatements(m.SQL, quoted, base)
	}
	return steps
}

// schemaStatements renders a dialect's embedded DDL for a table and splits
// it into statements at each ";" that ends a line.
func schemaStatements(ddl, quoted, base string) []string {
	var stmts []string
	for _, s := range strings.Split(render(ddl, quoted, base), ";\n") {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			stmts = append(stmts, strings.Join(lines, "\n"))
		}
	}
	return stmts
}
