package idem

// dialects are the Dialects IsRetryable consults.
var dialects = []Dialect{Postgres, MySQL, MariaDB, TiDB, SQLite}

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
