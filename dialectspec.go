package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DialectSpec is a database family as data, for [NewDialect]: its
// statements, and how it reads its driver's errors. idem's own dialects
// are built from one each; a caller builds one to add a database that
// idem does not know, as goose's Querier does. Name, Statements, Inserted
// and Retryable are required; a nil function of the others does nothing
// (reports false, "", nil, NoSchemaFault).
//
// Some capabilities stay with idem's own dialects, as fields a caller
// cannot set: writing the arguments into a statement's text (MySQL,
// lib/pq), bounding lock waits ([WithLockTimeout]; a dialect without it
// refuses the option), sending Do's statements through a [Pipeline],
// building an index beside the traffic, reading a purge window ahead,
// passing over held rows in a purge, and waiting for standbys
// ([Store.WaitReplicated]).
type DialectSpec struct {
	// Name is the dialect's name, as [Dialect]'s Name and [Event]'s
	// Dialect report it.
	Name string
	// Statements returns the statements for a table: its name as one
	// part, or as a schema and the table, each a valid identifier. Its
	// result is checked once by NewDialect, for the table
	// idempotency_keys: [StatementsOf] returns those of an existing
	// dialect to start from.
	Statements func(table []string) Statements
	// Inserted reads the outcome of Statements' Insert (and InsertOwn,
	// InsertDone), run with n rows changed, or its error: true when the
	// row was inserted, false when the key already had one (an error the
	// database reports for a duplicate key is read as false, nil).
	Inserted func(n int64, err error) (bool, error)
	// Retryable reports a serialization failure, deadlock or lock
	// timeout of the database. [IsRetryable], and so [RunTx], asks it of
	// the errors of the Store's statements (an [Error] carries its
	// answer); idem's own dialects it asks of any error.
	Retryable func(err error) bool
	// Applied reports an error of a migration's statement that says it
	// has run already (a column or index that exists, or one to drop that
	// does not), so that Migrate runs a migration that failed part way
	// again from its start.
	Applied func(err error) bool
	// Fix names what to change for an error of the driver where the hint
	// of idem's errors would send the user the wrong way, or returns "".
	Fix func(err error) string
	// CheckSession refuses, before a claim, a transaction in a mode where
	// a duplicate would not wait for the claim, with an error naming the
	// setting. c is the handle's Conn.
	CheckSession func(ctx context.Context, c Conn) error
	// CausalReads refuses a session whose transactions may begin before
	// its node has applied what the database acknowledged elsewhere.
	CausalReads func(ctx context.Context, c Conn) error
	// SchemaFault reads an error of the database as one about the table a
	// statement named (it does not exist, its columns are not those of
	// idem's table or of an older release, its schema does not exist),
	// for Migrate's and the errors' advice, or returns NoSchemaFault.
	SchemaFault func(err error) SchemaFault

	// The capabilities only idem's own dialects have.
	statements    func(parts []string) *statements
	literals      func(c Conn) func(Query) Query
	boundLockWait lockWaiter
	claimGone     func(err error) bool
}

// Statements are a dialect's statements for one table, as data: each
// statement's text, whole, with the table's name in it, and what it takes
// in place of each placeholder ([Arg]). Times come from the database
// clock; durations are in microseconds. The statements that change a
// claim after it was made (Complete, Extend, Release, Remove,
// ResealWrite) are fenced: they change the record only while it is the
// claim with the given token, and then always change a column, so that a
// database that counts changed rows reports the match. Every Statement is
// required but Claimed; the statements struct in idem's dialect.go
// describes each at length, and idem's own (StatementsOf) show what each
// returns, in which order.
type Statements struct {
	// Quoted is the table's whole name, quoted as the statements name it.
	Quoted string
	// Schema is the schema of a table named without one, as ArgSchema
	// gives it: nil for the connection's.
	Schema any
	// Migrations is the DDL of each schema version, in order, each as its
	// statements: Migrations[i] brings a table of version i (0: absent)
	// to version i+1. Each is safe to run again once it has run, or fails
	// without changing anything (Applied).
	Migrations [][]string
	// Version reads whether the table exists (a boolean) and the schema
	// version it is of ("idem schema N", or "" for version 1).
	Version Statement
	// Insert claims a new key as processing with a token from the
	// database clock, its lease and expiry (ArgExpiry), or does nothing
	// when the key has a record; InsertReturns says what it returns.
	Insert Statement
	// InsertOwn is Insert with the claim's token given (ArgToken). It
	// returns nothing.
	InsertOwn Statement
	// InsertDone is InsertOwn of a record completed in the same statement:
	// its response stored. It returns nothing.
	InsertDone Statement
	// Takeover makes the record a new processing claim, if its token is
	// still the one read and it may be taken over (released, lease ended,
	// forgotten); TakeoverReturns says what it returns.
	Takeover Statement
	// InsertReturns and TakeoverReturns are what Insert and Takeover
	// return when they claim.
	InsertReturns, TakeoverReturns Returning
	// Claimed reads the token of the claim the transaction has just made
	// and how long ago (µs) its statement started: required where Insert
	// or Takeover do not return both.
	Claimed Statement
	// Read reads a record as last committed: operation, fingerprint,
	// status, token, forgotten, expired, lease left (µs), response status,
	// header, body and sealed_key.
	Read Statement
	// ReadCompleted reads a completed record within its expiry: what Read
	// reads of the response and request, then the time left to its
	// expiry (µs).
	ReadCompleted Statement
	// State reads a record's status and token as last committed.
	State Statement
	// Complete stores the claim's response. Fenced.
	Complete Statement
	// Extend moves the lease's end to at least ArgLease from now. Fenced.
	Extend Statement
	// Release ends the claim without a result. Fenced.
	Release Statement
	// Remove deletes Do's claim after its function failed. Fenced on the
	// token.
	Remove Statement
	// PurgeWindow reads, locking nothing, how many records from the cursor
	// have expired (at most ArgLimit), the expiry of the last (µs), and
	// how many of them Strip would make tombstones.
	PurgeWindow Statement
	// Purge deletes those records, but for the completed ones whose
	// forget time is ahead, and never a live claim.
	Purge Statement
	// Strip makes tombstones of those records whose forget time is ahead.
	Strip Statement
	// LegacyWindow and LegacyPurge are PurgeWindow (without tombstones)
	// and Purge of the records without an expiry, by created_at.
	LegacyWindow, LegacyPurge Statement
	// PurgeIsolation is the isolation level of each purge batch's
	// transaction.
	PurgeIsolation sql.IsolationLevel
	// ResealRead reads and locks at most ArgLimit completed records whose
	// response is not sealed with ArgSealedKey: scope, key, operation,
	// token, expires_at (µs), sealed_key, header and body.
	ResealRead Statement
	// ResealLeft counts the records ResealRead would read.
	ResealLeft Statement
	// ResealWrite stores a record's response sealed anew. Fenced.
	ResealWrite Statement
	// Inspect reads a record for a person, locking nothing.
	Inspect Statement
	// InspectKey reads the records of a key in every scope.
	InspectKey Statement
	// Stats counts the records per status.
	Stats Statement
	// Size reads the bytes of the table and of its indexes.
	Size Statement
	// NoReplicationWait says what the database offers instead of waiting
	// for its replicas, for [Store.WaitReplicated]'s error.
	NoReplicationWait string
}

// NewDialect returns the Dialect that spec describes, or an error naming
// what spec lacks: an empty name, a missing function or statement, or an
// argument that is no [Arg].
func NewDialect(spec DialectSpec) (Dialect, error) {
	if spec.Name == "" {
		return nil, errors.New("idem: dialect: empty name")
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("idem: dialect %q: "+format, append([]any{spec.Name}, a...)...)
	}
	if spec.statements == nil {
		if spec.Statements == nil {
			return nil, fail("no Statements")
		}
		pub := spec.Statements
		spec.statements = func(parts []string) *statements { return internalStatements(pub(parts), parts) }
	}
	switch {
	case spec.Inserted == nil:
		return nil, fail("no Inserted")
	case spec.Retryable == nil:
		return nil, fail("no Retryable")
	}
	if err := checkStatements(spec.statements([]string{DefaultTable})); err != "" {
		return nil, fail("%s", err)
	}
	if spec.Applied == nil {
		spec.Applied = func(error) bool { return false }
	}
	if spec.Fix == nil {
		spec.Fix = func(error) string { return "" }
	}
	if spec.CheckSession == nil {
		spec.CheckSession = func(context.Context, Conn) error { return nil }
	}
	if spec.CausalReads == nil {
		spec.CausalReads = func(context.Context, Conn) error { return nil }
	}
	if spec.SchemaFault == nil {
		spec.SchemaFault = func(error) SchemaFault { return NoSchemaFault }
	}
	if spec.literals == nil {
		spec.literals = func(Conn) func(Query) Query { return nil }
	}
	return &specDialect{spec}, nil
}

// mustDialect is NewDialect of one of idem's own dialects.
func mustDialect(spec DialectSpec) Dialect {
	d, err := NewDialect(spec)
	if err != nil {
		panic(err)
	}
	return d
}

// StatementsOf returns d's statements for a table, named by one part or by
// a schema and the table, as a DialectSpec's Statements takes it: a
// dialect's to start from. It leaves out what only idem's own dialects
// have (see [DialectSpec]).
func StatementsOf(d Dialect, table []string) (Statements, error) {
	if d == nil {
		return Statements{}, errors.New("idem: StatementsOf: nil Dialect")
	}
	parts, err := parseTable(strings.Join(table, "."))
	if err != nil {
		return Statements{}, err
	}
	st := d.statements(parts)
	pub := Statements{Quoted: st.table.quoted, Schema: st.table.schemaName}
	pv, iv := reflect.ValueOf(&pub).Elem(), reflect.ValueOf(st).Elem()
	for _, f := range publicFields() {
		pv.FieldByIndex(f.Index).Set(unexported(iv, f.Name))
	}
	return pub, nil
}

// internalStatements is a caller's statements for the table parts as
// idem keeps them.
func internalStatements(pub Statements, parts []string) *statements {
	st := &statements{
		columns: Statement{SQL: render(columnsProbeSQL, pub.Quoted, parts[len(parts)-1])},
		table:   table{parts: parts, quoted: pub.Quoted, schemaName: pub.Schema},
	}
	pv, iv := reflect.ValueOf(pub), reflect.ValueOf(st).Elem()
	for _, f := range publicFields() {
		unexported(iv, f.Name).Set(pv.FieldByIndex(f.Index))
	}
	return st
}

// publicFields are the fields of Statements that statements has too,
// under the same name with a lower-case first letter: all but Quoted
// and Schema, which are its table's.
func publicFields() []reflect.StructField {
	t := reflect.TypeFor[Statements]()
	var fs []reflect.StructField
	for i := range t.NumField() {
		if f := t.Field(i); f.Name != "Quoted" && f.Name != "Schema" {
			fs = append(fs, f)
		}
	}
	return fs
}

// unexported is the field of st, a statements, that the field of
// Statements named name is, as a settable value.
func unexported(st reflect.Value, name string) reflect.Value {
	r, n := utf8.DecodeRuneInString(name)
	f := st.FieldByName(string(unicode.ToLower(r)) + name[n:])
	return reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem()
}

// checkStatements says what st lacks, or returns "".
func checkStatements(st *statements) string {
	if st.table.quoted == "" {
		return "Statements: no Quoted table name"
	}
	if len(st.migrations) == 0 {
		return "Statements: no Migrations"
	}
	iv := reflect.ValueOf(st).Elem()
	for _, f := range publicFields() {
		s, ok := unexported(iv, f.Name).Interface().(Statement)
		if !ok {
			continue
		}
		if strings.TrimSpace(s.SQL) == "" && f.Name != "Claimed" {
			return "Statements: no " + f.Name
		}
		for _, a := range s.Args {
			if a >= argEnd {
				return fmt.Sprintf("Statements: %s takes Arg %d, which is none", f.Name, a)
			}
		}
	}
	both := Returning{Token: true, Lag: true}
	if st.claimed.SQL == "" && (st.insertReturns != both || st.takeoverReturns != both) {
		return "Statements: no Claimed, and Insert or Takeover does not return the token and the lag"
	}
	return ""
}

// specDialect is a Dialect built from a DialectSpec.
type specDialect struct{ spec DialectSpec }

func (d *specDialect) Name() string                              { return d.spec.Name }
func (d *specDialect) statements(parts []string) *statements     { return d.spec.statements(parts) }
func (d *specDialect) inserted(n int64, err error) (bool, error) { return d.spec.Inserted(n, err) }
func (d *specDialect) retryable(err error) bool                  { return d.spec.Retryable(err) }
func (d *specDialect) fix(err error) string                      { return d.spec.Fix(err) }
func (d *specDialect) literals(c Conn) func(Query) Query         { return d.spec.literals(c) }
func (d *specDialect) applied(err error) bool                    { return d.spec.Applied(err) }
func (d *specDialect) schemaFault(err error) SchemaFault         { return d.spec.SchemaFault(err) }
func (d *specDialect) checkSession(ctx context.Context, c Conn) error {
	return d.spec.CheckSession(ctx, c)
}
func (d *specDialect) causalReads(ctx context.Context, c Conn) error {
	return d.spec.CausalReads(ctx, c)
}
func (d *specDialect) lockWaiter() lockWaiter          { return d.spec.boundLockWait }
func (d *specDialect) claimGone() func(err error) bool { return d.spec.claimGone }
