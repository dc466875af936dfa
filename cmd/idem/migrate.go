package main

import (
	"context"
	"fmt"
	"io"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f dbFlags
	fs := newFlags("migrate", "--dsn DSN [--table NAME]",
		"Creates the idempotency table and its indexes if they are absent, or brings\n"+
			"a table that an earlier release of idem made to the newest layout, one\n"+
			"numbered migration of package schema at a time (docs/operations.md says\n"+
			"what each one locks). Refuses a table that is not idem's, changing\n"+
			"nothing. Safe to run again. A SQLite file is created if needed.", stderr)
	f.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	db, t, s, err := f.open(ctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := s.Migrate(ctx, db); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "table %s is ready on %s (created if it was absent, upgraded if it was older)\n", s.Table(), t.Where)
	return nil
}
