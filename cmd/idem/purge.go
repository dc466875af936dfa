package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		f         dbFlags
		retention time.Duration
		keyMemory time.Duration
		batch     int
		workers   int
	)
	fs := newFlags("purge", "--dsn DSN [--table NAME] [--retention 24h] [--key-memory 0] [--batch 1000] [--workers 1]",
		"Purges the records past their expiry in short batches, one line per batch:\n"+
			"deletes them, but makes a tombstone of each completed record whose key\n"+
			"memory is still running (its response dropped, its key refused until its\n"+
			"forget time). Each record keeps its own expiry and forget time, whatever\n"+
			"the flags; --retention and --key-memory apply only to the records of\n"+
			"releases before per-record expiry and forget time, which have none.\n"+
			"Never touches a live claim and passes over rows a transaction holds\n"+
			"(TiDB waits for them); safe beside live traffic and from several\n"+
			"processes at once. With --workers N, N batches run at once, each on its\n"+
			"own window of the table: a backlog goes faster, at some cost to traffic.", stderr)
	f.register(fs)
	fs.DurationVar(&retention, "retention", idem.DefaultRetention, "the application's retention, for the records of a release before per-record expiry (they have none)")
	fs.DurationVar(&keyMemory, "key-memory", 0, "the application's key memory, for the completed records of a release before per-record forget times (they have none); every other record keeps its own")
	fs.IntVar(&batch, "batch", 1000, "records purged per batch")
	fs.IntVar(&workers, "workers", 1, "batches run at once, each on a connection of its own")
	if err := parse(fs, args); err != nil {
		return err
	}
	if batch <= 0 {
		return usageErr("purge: --batch must be positive, got %d", batch)
	}
	if workers <= 0 {
		return usageErr("purge: --workers must be positive, got %d", workers)
	}
	db, _, s, err := f.open(ctx, false, idem.WithRetention(retention), idem.WithKeyMemory(keyMemory))
	if err != nil {
		return err
	}
	defer db.Close()
	if keyMemory > 0 {
		fmt.Fprintf(stderr, "idem: --key-memory %s applies only to the completed records of a release before per-record forget times; every other record keeps the forget time it was completed with\n", dur(keyMemory))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	pool := idem.NewSQLRunner(db, nil)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		total    idem.Purged
		batches  int
		firstErr error // the batch that failed first; the others are then cancelled
	)
	for range workers {
		wg.Go(func() {
			for {
				p, err := s.PurgeBatchDetail(ctx, pool, batch)
				mu.Lock()
				total.Deleted += p.Deleted
				total.Tombstoned += p.Tombstoned
				if p.Records() > 0 {
					batches++
					fmt.Fprintf(stdout, "batch %d: %s (%s so far)\n", batches, purged(p), purged(total))
				}
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
				if err != nil || p.Records() < int64(batch) {
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil && total.Records() > 0 {
		return fmt.Errorf("%w (after %s)", firstErr, purged(total))
	}
	if firstErr != nil {
		return firstErr
	}
	fmt.Fprintf(stdout, "purged %s past their expiry from %s in %s: %s\n", plural(total.Records(), "record"), s.Table(), time.Since(start).Round(time.Millisecond), purged(total))
	return nil
}

// purged says what a purge did: how many records it deleted, and how many
// it made tombstones.
func purged(p idem.Purged) string {
	return fmt.Sprintf("%d deleted, %s", p.Deleted, plural(p.Tombstoned, "tombstone"))
}
