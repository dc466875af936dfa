package idem

import "github.com/idemkit/idem/schema"

// MariaDB is the dialect for MariaDB 10.6+, through
// github.com/go-sql-driver/mysql: MySQL's table, statements, locking and
// errors (see [MySQL], which runs on MariaDB too), with one statement
// fewer for each new claim of Begin's. Its INSERT returns the claim's
// token (INSERT ... RETURNING, which MySQL lacks), where MySQL reads it
// back with a SELECT after the INSERT. (Do's claim of a new key needs
// neither: it carries a token Do chose.) The RETURNING clause reads no
// auto-increment value and sets none, so LAST_INSERT_ID() stays the
// caller's.
//
// The INSERT does not return how long it waited for the key: MariaDB's
// clock functions are the statement's start throughout it. Begin, which
// needs that to count its lease from the grant, reads it as MySQL does.
var MariaDB Dialect = mariadbDialect{}

type mariadbDialect struct{ mysqlDialect }

func (mariadbDialect) Name() string { return "mariadb" }

func (mariadbDialect) statements(parts []string) *statements {
	return galera(myStatements(parts, schema.MySQL, mariadbInsert, returning{token: true}, myShareLock), galeraCausal)
}

// mariadbInsert is MySQL's insert, returning the token.
const mariadbInsert = myInsert + `
RETURNING token`
