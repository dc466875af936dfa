package idem

// dialects are the Dialects IsRetryable consults.
var dialects = []Dialect{Postgres, MySQL, MariaDB, TiDB, SQLite}
