package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/idemkit/idem"
)

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		f         dbFlags
		retention time.Duration
		batch     int
	)
	fs := newFlags("purge", "--dsn DSN [--table NAME] [--retention 24h] [--batch 1000]",
		"Deletes the records past retention in short batches, one line per batch.\nNever touches a live claim; safe beside live traffic and from several\nprocesses at once.", stderr)
	f.register(fs)
	fs.DurationVar(&retention, "retention", idem.DefaultRetention, "the application's retention: records older than this go")
	fs.IntVar(&batch, "batch", 1000, "records deleted per batch")
	if err := parse(fs, args); err != nil {
		return err
	}
	if batch <= 0 {
		return usageErr("purge: --batch must be positive, got %d", batch)
	}
	db, _, s, err := f.open(ctx, false, idem.WithRetention(retention))
	if err != nil {
		return err
	}
	defer db.Close()
	start := time.Now()
	var total int64
	for i := 1; ; i++ {
		n, err := s.PurgeBatch(ctx, db, batch)
		if err != nil {
			return fmt.Errorf("%w (after deleting %d)", err, total)
		}
		total += n
		if n > 0 {
			fmt.Fprintf(stdout, "batch %d: deleted %d (%d so far)\n", i, n, total)
		}
		if n < int64(batch) {
			break
		}
	}
	fmt.Fprintf(stdout, "purged %d records past retention %s from %s in %s\n", total, dur(retention), s.Table(), time.Since(start).Round(time.Millisecond))
	return nil
}
