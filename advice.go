package idem

import (
	"context"
	"errors"
	"fmt"
)

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

// next is advice for a statement inside a transaction (Do's, a Claim's):
// roll it back, or run it again whole where a retry may cure err.
func (s *Store) next(err error) string {
	switch a := s.advice(err, ""); {
	case a != "":
		return a + "; " + hintRollBack
	case IsRetryable(err) || s.dialect.retryable(err):
		return hintRetry
	}
	return hintRollBack
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

// fixFor is what a dialect says to change for err, or "", asking every
// dialect as IsRetryable does.
func fixFor(err error) string {
	for _, d := range dialects {
		if fix := d.fix(err); fix != "" {
			return fix
		}
	}
	return ""
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
