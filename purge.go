package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Purge deletes the records past retention: completed ones whose response
// was stored longer ago than the retention, and claims whose lease ended
// longer ago than that. It deletes in batches of at most batch rows, oldest
// first, each a read of what it will delete and a DELETE in a short
// transaction of its own on db (READ COMMITTED on PostgreSQL and MySQL,
// retried like [RunTx] on a deadlock or a busy database), until a batch
// comes back short, and returns how many it deleted. A PROCESSING claim
// with a live lease is never touched, and rows a live transaction holds are
// skipped (Postgres) or waited for (MySQL, also the first row past the
// batch's window, up to innodb_lock_wait_timeout); on SQLite each batch
// waits for the write lock like any writer. So Purge may run from several
// processes at once and beside live traffic. Each batch starts where the
// Store's previous batch ended, so that it does not walk again the rows
// earlier batches deleted; a record passed over (a live claim that has
// since expired, a row that was locked) is deleted by the next sweep, which
// starts from the oldest record after a batch that came back short. Purge
// and PurgeBatch may also run from several goroutines on one Store: batches
// that run at once take consecutive windows of the table and do not wait
// for each other's rows, so a backlog is purged faster, at some cost to the
// traffic beside it. Each batch is reported to the [Store]'s [Observer].
// See docs/operations.md for batch sizes, cadence and workers.
func (s *Store) Purge(ctx context.Context, db *sql.DB, batch int) (int64, error) {
	if db == nil {
		return 0, errors.New("idem: Purge needs a *sql.DB, got nil")
	}
	return s.PurgeOn(ctx, NewSQLRunner(db, nil), batch)
}

// PurgeOn is [Store.Purge] on r, a pool through any driver's adapter
// (idempgx.New for a *pgxpool.Pool): each batch runs in a short
// transaction of r's. To run batches from several goroutines at once, r's
// pool must be safe for concurrent use.
func (s *Store) PurgeOn(ctx context.Context, r Runner, batch int) (int64, error) {
	if r == nil {
		return 0, errors.New("idem: Purge needs a pool, got nil")
	}
	if batch <= 0 {
		return 0, fmt.Errorf("idem: Purge batch must be positive, got %d", batch)
	}
	var total int64
	for {
		n, err := s.deleteBatch(ctx, r, batch)
		if err != nil {
			return total, &Error{Op: "purge " + s.table, Err: err,
				Detail: fmt.Sprintf("stopped after deleting %d records: %s", total, reason(err)),
				Hint:   s.advice(err, "the deleted ones stay deleted, run Purge again")}
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

// PurgeBatch deletes at most limit records past retention, as Purge does,
// with one DELETE in a short transaction, and returns how many it deleted.
// Purge calls it until a batch comes back short; call it yourself to pace
// a purge or to report its progress.
func (s *Store) PurgeBatch(ctx context.Context, db *sql.DB, limit int) (int64, error) {
	if db == nil {
		return 0, errors.New("idem: PurgeBatch needs a *sql.DB, got nil")
	}
	return s.PurgeBatchOn(ctx, NewSQLRunner(db, nil), limit)
}

// PurgeBatchOn is [Store.PurgeBatch] on r, a pool through any driver's
// adapter.
func (s *Store) PurgeBatchOn(ctx context.Context, r Runner, limit int) (int64, error) {
	if r == nil {
		return 0, errors.New("idem: PurgeBatch needs a pool, got nil")
	}
	if limit <= 0 {
		return 0, fmt.Errorf("idem: PurgeBatch limit must be positive, got %d", limit)
	}
	n, err := s.deleteBatch(ctx, r, limit)
	if err != nil {
		return n, &Error{Op: "purge " + s.table, Err: err, Hint: s.advice(err, "nothing of this batch was deleted, run it again")}
	}
	return n, nil
}

// deleteBatch deletes one batch in a transaction of the dialect's purge
// isolation level, retried as RunTx retries (a deadlock on MySQL, a busy
// database on SQLite: the batch is safe to run again), and reports it to
// the Observer.
func (s *Store) deleteBatch(ctx context.Context, r Runner, limit int) (n int64, err error) {
	start := startWatch()
	defer func() { s.observe(ctx, Event{Kind: EventPurgeBatch, Duration: start.elapsed(), Rows: n, Err: err}) }()
	retention := micros(s.retention)
	from, to, found, err := s.purgeWindow(ctx, r, retention, limit)
	if err != nil || !found {
		return 0, err
	}
	err = InTx(ctx, r, s.st.purgeIsolation, func(tx Tx) (err error) {
		n, err = s.conn(tx).exec(ctx, s.st.query(s.st.purge, &values{from: from, retention: retention, limit: limit}))
		return err
	})
	if err != nil {
		s.purgeFrom.CompareAndSwap(to, from) // the next batch takes this window again
		return 0, err
	}
	return n, nil
}

// purgeWindow takes the next window of the sweep for a batch of limit
// records: it reads, from the Store's purge cursor on, how many records
// past retention the batch would delete and the created_at of the last of
// them, and moves the cursor there, to the next batch's start. found is
// false when there is none. A window shorter than limit ends the sweep:
// the cursor goes back to the beginning.
//
// A deleted row stays in the table's indexes until the database reclaims
// it (InnoDB's purge thread, a VACUUM), and a batch that started at the
// beginning would walk every such row before the first it can delete;
// with the cursor, a sweep through the table reads each row once. A record
// the cursor has passed (one that was a live claim then, or locked) is
// purged by the next sweep.
//
// The read locks nothing, and the cursor moves only if no other batch of
// the Store moved it meanwhile (else the window is read again from where
// that batch left it). So batches that run at once, from several
// goroutines, delete consecutive windows instead of waiting for each
// other's rows.
func (s *Store) purgeWindow(ctx context.Context, r Runner, retention int64, limit int) (from, to int64, found bool, err error) {
	for {
		from = s.purgeFrom.Load()
		var n int64
		err = InTx(ctx, r, s.st.purgeIsolation, func(tx Tx) error {
			q := s.st.query(s.st.purgeWindow, &values{from: from, retention: retention, limit: limit})
			return s.conn(tx).queryRow(ctx, q, &n, &to)
		})
		if err != nil {
			return 0, 0, false, err
		}
		if n < int64(limit) {
			to = 0
		}
		if s.purgeFrom.CompareAndSwap(from, to) {
			return from, to, n > 0, nil
		}
	}
}
