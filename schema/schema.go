// Package schema holds idem's DDL, one file per dialect, for the default
// table name idempotency_keys. Store.Migrate applies it (with the Store's
// table name); users of goose, golang-migrate or any other migration tool
// can copy a file into their own migrations or read it from FS.
//
// Columns, for every dialect:
//
//	scope, idem_key   the primary key; compared byte for byte
//	operation         what the key is bound to
//	fingerprint       digest of the request payload
//	status            'processing', 'completed' or 'released'
//	token             fencing token: grows with every takeover, never repeats
//	lease_until       end of a PROCESSING claim's lease (database clock, UTC)
//	created_at        when the current claim was made (purge index)
//	completed_at      when the response was stored
//	response_status   the stored HTTP status code
//	response_headers  the stored header, idem's own length-prefixed encoding
//	response_body     the stored body, as bytes
package schema

import "embed"

// FS holds one .sql file per dialect.
//
//go:embed *.sql
var FS embed.FS

// The DDL of each dialect, as in FS.
var (
	Postgres = mustRead("postgres.sql")
	MySQL    = mustRead("mysql.sql")
	TiDB     = mustRead("tidb.sql")
	SQLite   = mustRead("sqlite.sql")
)

func mustRead(name string) string {
	b, err := FS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}
