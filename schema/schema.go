// Package schema holds idem's DDL for the default table name
// idempotency_keys, as numbered migrations, one directory per dialect:
//
//	postgres/0001_create.up.sql       the table and its created_at index
//	postgres/0002_autovacuum.up.sql   storage and autovacuum settings
//	postgres/0003_expiry.up.sql       each record's expiry and seal key
//	postgres/0004_forget.up.sql       each record's forget time (key memory)
//	mysql/0001_create.up.sql          the table, clustered on (scope, idem_key)
//	mysql/0002_insertion_order.up.sql clustered on (created_at, scope, idem_key)
//	mysql/0003_expiry.up.sql          each record's expiry and seal key
//	mysql/0004_expiry_order.up.sql    clustered on (expires_at, scope, idem_key)
//	mysql/0005_forget.up.sql          each record's forget time (key memory)
//	tidb/0001_create.up.sql
//	tidb/0002_expiry.up.sql           each record's expiry and seal key
//	tidb/0003_forget.up.sql           each record's forget time (key memory)
//	sqlite/0001_create.up.sql
//	sqlite/0002_expiry.up.sql         each record's expiry and seal key
//	sqlite/0003_forget.up.sql         each record's forget time (key memory)
//
// File N brings a table to schema version N; version 1 is the table every
// release before versioning made. Store.Migrate applies the files a table
// has not had, in order, with the Store's table name, and records the
// version in the table's comment (from version 2 on; a table without one
// is of version 1; SQLite's tables have no comment, and its version 2 is
// told by its expires_at index, its version 3 by its forget_at column). goose and golang-migrate read a directory as it is:
// each file is NNNN_name.up.sql with a "-- +goose Up" annotation, the
// names both tools number their migrations by. Copy the directory of your
// dialect into your migrations, or point the tool at FS. docs/operations.md
// says what each migration locks and for how long.
//
// Columns, for every dialect:
//
//	scope, idem_key   unique together; compared byte for byte
//	operation         what the key is bound to
//	fingerprint       digest of the request payload
//	status            'processing', 'completed', 'released' or 'expired'
//	                  (a tombstone: a completed record whose response is
//	                  gone, kept to its forget time)
//	token             fencing token: grows with every takeover, never repeats
//	                  (a new claim of Do's: a random negative number)
//	lease_until       end of a PROCESSING claim's lease (database clock, UTC)
//	created_at        when the current claim was made
//	completed_at      when the response was stored
//	response_status   the stored HTTP status code
//	response_headers  the stored header, idem's own length-prefixed encoding
//	response_body     the stored body, as bytes
//	expires_at        when the response stops replaying, or the claim may be
//	                  forgotten (the purge's order); NULL on a row written
//	                  before version 3 (2 on TiDB and SQLite), which expires
//	                  by the Store's retention; never NULL on MySQL from
//	                  version 4, whose primary key it leads
//	sealed_key        NULL in the clear; else the name of the key that sealed
//	                  the response into response_body (response_headers NULL)
//	forget_at         when a completed record's key may be forgotten: its
//	                  expiry plus the key memory of the request or Store
//	                  that completed it (Request.KeyMemory, WithKeyMemory),
//	                  which every purge honours; NULL on a claim and on a
//	                  row written before version 4 (PostgreSQL), 5 (MySQL)
//	                  or 3 (TiDB, SQLite), which keeps the key memory of
//	                  the Store that reads or purges it
//	result_ref        the reference to what the request created
//	                  (Response.Reference), one byte saying how it is
//	                  stored (0 in the clear, 1 sealed) then the text or
//	                  the sealed bytes; kept in a tombstone, so that a late
//	                  retry's ErrExpired names it; NULL for none. Added by
//	                  the same version as forget_at
package schema

import (
	"embed"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// FS holds the migrations, one directory per dialect.
//
//go:embed postgres mysql tidb sqlite
var FS embed.FS

// Migration is one file of a dialect's directory.
type Migration struct {
	Version int    // the schema version the file brings a table to
	Name    string // the file's name, e.g. 0002_insertion_order.up.sql
	SQL     string // its text
}

// The migrations of each dialect, in order: the one at index i brings a
// table to version i+1.
var (
	Postgres = mustRead("postgres")
	MySQL    = mustRead("mysql")
	TiDB     = mustRead("tidb")
	SQLite   = mustRead("sqlite")
)

// mustRead reads a dialect's directory and checks that its files are
// numbered 1, 2, ... without a gap.
func mustRead(dir string) []Migration {
	entries, err := fs.ReadDir(FS, dir)
	if err != nil {
		panic(err)
	}
	var ms []Migration
	for i, e := range entries {
		n, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(n)
		if !ok || err != nil || v != i+1 || !strings.HasSuffix(e.Name(), ".up.sql") {
			panic(fmt.Sprintf("schema: %s/%s is not migration %04d_NAME.up.sql", dir, e.Name(), i+1))
		}
		b, err := FS.ReadFile(dir + "/" + e.Name())
		if err != nil {
			panic(err)
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	return ms
}
