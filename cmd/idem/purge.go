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
		"Deletes the records past their retention in short batches, one line per\nbatch; with --key-memory, drops the responses of completed ones and keeps\ntheir keys until it passes.\nNever touches a live claim; safe beside live traffic and from several\nprocesses at once. With --workers N, N batches run at once, each on its\nown window of the table: a backlog goes faster, at some cost to traffic.", stderr)
	f.register(fs)
	fs.DurationVar(&retention, "retention", idem.DefaultRetention, "the application's retention: records of a release before per-request retention older than this go")
	fs.DurationVar(&keyMemory, "key-memory", 0, "the application's key memory (idem.WithKeyMemory): completed records past their retention keep their key this long, without their response")
	fs.IntVar(&batch, "batch", 1000, "records deleted per batch")
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		total    int64
		batches  int
		firstErr error // the batch that failed first; the others are then cancelled
	)
	for range workers {
		wg.Go(func() {
			for {
				n, err := s.PurgeBatch(ctx, db, batch)
				mu.Lock()
				total += n
				if n > 0 {
					batches++
					fmt.Fprintf(stdout, "batch %d: deleted %d (%d so far)\n", batches, n, total)
				}
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
				if err != nil || n < int64(batch) {
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil && total > 0 {
		return fmt.Errorf("%w (after deleting %s)", firstErr, plural(total, "record"))
	}
	if firstErr != nil {
		return firstErr
	}
	fmt.Fprintf(stdout, "purged %s past retention %s from %s in %s\n", plural(total, "record"), dur(retention), s.Table(), time.Since(start).Round(time.Millisecond))
	return nil
}
