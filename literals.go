package idem

import (
	"encoding/hex"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// maxInline bounds the text of a statement whose arguments literals writes
// into it; a statement with larger arguments (a big response body) is sent
// with parameters, whose size only max_allowed_packet limits.
const maxInline = 64 << 10

// literals: every statement through database/sql goes as text.
func (mysqlDialect) literals(c Conn) func(Query) Query {
	if _, ok := c.(interface{ sqlHandle() DBTX }); !ok {
		return nil
	}
	return myLiterals
}

// myLiterals writes the arguments into the query as literals: strings and
// byte slices as hexadecimal literals (X'6869'), which mean the same bytes
// whatever the connection's character set or sql_mode, nil and a nil byte
// slice as NULL, integers in decimal. go-sql-driver/mysql then sends the statement
// as text in one round trip, where with parameters it prepares, executes
// and closes it (two round trips and a statement the server builds and
// frees), unless the DSN sets interpolateParams. The query's only "?" are
// its placeholders: idem's SQL holds no string literal or identifier with
// one.
func myLiterals(q Query) Query {
	size := len(q.SQL)
	for _, a := range q.Args {
		switch v := a.(type) {
		case string:
			size += 3 + hex.EncodedLen(len(v))
		case []byte:
			size += 4 + hex.EncodedLen(len(v))
		case int, int64:
			size += 20
		case nil:
			size += 4
		default:
			return q
		}
	}
	if size > maxInline || strings.Count(q.SQL, "?") != len(q.Args) {
		return q
	}
	var b strings.Builder
	b.Grow(size)
	rest := q.SQL
	for _, a := range q.Args {
		i := strings.IndexByte(rest, '?')
		b.WriteString(rest[:i])
		rest = rest[i+1:]
		switch v := a.(type) {
		case string:
			writeHexLiteral(&b, v)
		case []byte:
			if v == nil {
				b.WriteString("NULL")
			} else {
				writeHexLiteral(&b, v)
			}
		case int:
			var buf [20]byte
			b.Write(strconv.AppendInt(buf[:0], int64(v), 10))
		case int64:
			var buf [20]byte
			b.Write(strconv.AppendInt(buf[:0], v, 10))
		case nil:
			b.WriteString("NULL")
		}
	}
	b.WriteString(rest)
	return Query{SQL: b.String()}
}

// writeHexLiteral writes v as MySQL's hexadecimal literal, X'6869'.
func writeHexLiteral[T string | []byte](b *strings.Builder, v T) {
	b.WriteString("X'")
	writeHex(b, v)
	b.WriteByte('\'')
}

// writeHex writes the bytes of v in lowercase hexadecimal.
func writeHex[T string | []byte](b *strings.Builder, v T) {
	const digits = "0123456789abcdef"
	for i := 0; i < len(v); i++ {
		b.WriteByte(digits[v[i]>>4])
		b.WriteByte(digits[v[i]&15])
	}
}

// literals writes the arguments into a statement as literals when db
// runs on lib/pq (pgLiterals), and leaves them parameters on any other
// driver (nil). lib/pq sends a statement
// with arguments in two round trips (Parse and Describe, then Bind and
// Execute: the server parses it for the first and plans it for the
// second), unless the DSN sets binary_parameters, and a statement without
// arguments as one simple query, parsed and planned at once: idem's two
// statements of a fresh Do then cost two round trips fewer, and a replay
// one or two. pgx's database/sql driver prepares each distinct text once
// per connection and runs it in one round trip from then on, so on pgx
// the text stays the same for every key, with parameters.
//
// Strings are escape strings (E'...', backslash and quote doubled), which
// mean the same whatever standard_conforming_strings says; byte slices
// are hex bytea (E'\\x6869'::bytea), a nil one NULL, and so is nil;
// integers decimal. A
// string with a byte outside printable ASCII (0x20..0x7E) keeps its
// parameters, so that no client encoding can read a byte of it as part
// of a character that swallows the backslash doubled after it (SJIS,
// BIG5 and GBK have such characters; lib/pq asks for UTF8 when it
// connects, but a session can SET client_encoding later); so does an
// argument of another type, or a statement whose text would pass
// maxInline. The query's only "$" are its
// placeholders: idem's SQL holds no string literal or identifier with one.
func (postgresDialect) literals(c Conn) func(Query) Query {
	if !onLibPQ(c) {
		return nil
	}
	return pgLiterals
}

// pgLiterals is q with its arguments written into its text as literals,
// or q as it is when there are none or one of them cannot be (see
// literals).
func pgLiterals(q Query) Query {
	if len(q.Args) == 0 {
		return q
	}
	size := len(q.SQL)
	for _, a := range q.Args {
		switch v := a.(type) {
		case string:
			if !printableASCII(v) {
				return q
			}
			size += 3 + 2*len(v)
		case []byte:
			size += 13 + hex.EncodedLen(len(v))
		case int, int64:
			size += 22
		case nil:
			size += 4
		default:
			return q
		}
	}
	if size > maxInline {
		return q
	}
	var b strings.Builder
	b.Grow(size)
	rest := q.SQL
	for {
		i := strings.IndexByte(rest, '$')
		if i < 0 {
			break
		}
		j := i + 1
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(rest[i+1 : j])
		if err != nil || n < 1 || n > len(q.Args) {
			return q
		}
		b.WriteString(rest[:i])
		writePgLiteral(&b, q.Args[n-1])
		rest = rest[j:]
	}
	b.WriteString(rest)
	return Query{SQL: b.String()}
}

// printableASCII reports whether every byte of v is printable ASCII.
func printableASCII(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7E {
			return false
		}
	}
	return true
}

// writePgLiteral writes the literal of a, one of the types pgLiterals
// writes.
func writePgLiteral(b *strings.Builder, a any) {
	switch v := a.(type) {
	case string:
		b.WriteString("E'")
		for i := 0; i < len(v); i++ {
			if c := v[i]; c == '\\' || c == '\'' {
				b.WriteByte(c)
			}
			b.WriteByte(v[i])
		}
		b.WriteByte('\'')
	case []byte:
		if v == nil {
			b.WriteString("NULL")
			return
		}
		b.WriteString(`E'\\x`)
		writeHex(b, v)
		b.WriteString("'::bytea")
	case int:
		writePgInt(b, int64(v))
	case int64:
		writePgInt(b, v)
	case nil:
		b.WriteString("NULL")
	default:
		panic(fmt.Sprintf("idem: no PostgreSQL literal for %T", a))
	}
}

// writePgInt writes n in decimal, in parentheses when it is negative, so
// that a cast after it (-5::bigint) applies to the whole number.
func writePgInt(b *strings.Builder, n int64) {
	var buf [20]byte
	if n < 0 {
		b.WriteByte('(')
		b.Write(strconv.AppendInt(buf[:0], n, 10))
		b.WriteByte(')')
		return
	}
	b.Write(strconv.AppendInt(buf[:0], n, 10))
}

// libpqPkg is lib/pq's package path.
const libpqPkg = "github.com/lib/pq"

// onLibPQ reports whether c is database/sql's Conn on a transaction of
// lib/pq: a *sql.Tx, or a struct that embeds one (*sqlx.Tx), begun on a
// *sql.DB whose connector
// is lib/pq's (sql.Open("postgres", ...), pq.NewConnector). It reads the
// transaction's *sql.DB and that one's connector by reflection: database/sql
// has no method that names a transaction's driver, and idem imports none.
// Both fields are set when the transaction and the pool are made and never
// change. A handle it cannot read this way (another wrapper, a database/sql
// whose fields have other names) is not lib/pq's, and keeps its parameters.
func onLibPQ(c Conn) bool {
	h, ok := c.(interface{ sqlHandle() DBTX })
	if !ok {
		return false
	}
	tx := embeddedTx(h.sqlHandle())
	if tx == nil || txDB.Index == nil || dbConnector.Index == nil {
		return false
	}
	pool := reflect.ValueOf(tx).Elem().FieldByIndex(txDB.Index)
	if pool.Kind() != reflect.Pointer || pool.IsNil() {
		return false
	}
	connector := pool.Elem().FieldByIndex(dbConnector.Index)
	if connector.Kind() != reflect.Interface || connector.IsNil() {
		return false
	}
	connector = connector.Elem()
	if t := connector.Type(); t.Kind() == reflect.Struct && t.PkgPath() == "database/sql" {
		// sql.Open's connector, dsnConnector{dsn, driver}: the driver is
		// its field of the driver.Driver type.
		connector = driverField(connector)
	}
	if !connector.IsValid() {
		return false
	}
	t := connector.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() == libpqPkg
}
