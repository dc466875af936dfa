package idem

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
	return d.statements(parts).Statements, nil
}

// internalStatements is a caller's statements for the table parts as
// idem keeps them.
func internalStatements(pub Statements, parts []string) *statements {
	return &statements{
		Statements: pub,
		columns:    Statement{SQL: render(columnsProbeSQL, pub.Quoted, parts[len(parts)-1])},
		parts:      parts,
	}
}

// checkStatements says what st lacks, or returns "".
func checkStatements(st *statements) string {
	if st.Quoted == "" {
		return "Statements: no Quoted table name"
	}
	if len(st.Migrations) == 0 {
		return "Statements: no Migrations"
	}
	v := reflect.ValueOf(st.Statements)
	for i := range v.NumField() {
		s, ok := v.Field(i).Interface().(Statement)
		if !ok {
			continue
		}
		name := v.Type().Field(i).Name
		if strings.TrimSpace(s.SQL) == "" && name != "Claimed" {
			return "Statements: no " + name
		}
		for _, a := range s.Args {
			if a >= argEnd {
				return fmt.Sprintf("Statements: %s takes Arg %d, which is none", name, a)
			}
		}
	}
	both := Returning{Token: true, Lag: true}
	if st.Claimed.SQL == "" && (st.InsertReturns != both || st.TakeoverReturns != both) {
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
