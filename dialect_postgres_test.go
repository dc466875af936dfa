package idem

import (
	"errors"
	"fmt"
	"testing"
)

// pgFields is an error shaped like bun's pgdriver.Error: the fields of
// PostgreSQL's ErrorResponse, read by their protocol codes.
type pgFields map[byte]string

func (e pgFields) Field(code byte) string { return e[code] }
func (e pgFields) Error() string          { return e['M'] }

// sqlStateError is an error shaped like lib/pq's and pgx's.
type sqlStateError string

func (e sqlStateError) SQLState() string { return string(e) }
func (e sqlStateError) Error() string    { return "SQLSTATE " + string(e) }

// IsRetryable reads the SQLSTATE of every PostgreSQL driver's error,
// wrapped or joined, by SQLState() (lib/pq, pgx) or by Field('C') (bun's
// pgdriver, go-pg).
func TestPostgresRetryableByEitherInterface(t *testing.T) {
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"pgdriver serialization": {pgFields{'C': "40001", 'M': "could not serialize access"}, true},
		"pgdriver deadlock":      {fmt.Errorf("idem: claim: %w", pgFields{'C': "40P01"}), true},
		"pgdriver lock timeout":  {errors.Join(errors.New("other"), pgFields{'C': "55P03"}), true},
		"pgdriver unique":        {pgFields{'C': "23505"}, false},
		"pgdriver no code":       {pgFields{'M': "no code"}, false},
		"pgx serialization":      {fmt.Errorf("x: %w", sqlStateError("40001")), true},
		"pgx syntax":             {sqlStateError("42601"), false},
		"plain":                  {errors.New("40001"), false},
	} {
		if got := IsRetryable(c.err); got != c.want {
			t.Errorf("%s: IsRetryable = %v, want %v", name, got, c.want)
		}
	}
}
