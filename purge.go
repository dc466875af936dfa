package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Purge deletes the records past retention: completed ones whose response
// was stored longer ago than the retention, and claims whose lease ended
// longer ago than that. It deletes in batches of at most batch rows, each
// one statement in a short READ COMMITTED transaction of its own on db,
// oldest records first, until none is left, and returns how many it
// deleted. A PROCESSING claim with a live lease is never touched, and rows
// a live transaction holds are skipped (Postgres) or waited for briefly
// (MySQL), so Purge may run from several processes at once and beside live
// traffic. Each batch is reported to the Store's Observer. See
// docs/operations.md for batch sizes and cadence.
func (s *Store) Purge(ctx context.Context, db *sql.DB, batch int) (int64, error) {
	if s.err != nil {
		return 0, s.err
	}
	if db == nil {
		return 0, errors.New("idem: Purge needs a *sql.DB, got nil")
	}
	if batch <= 0 {
		return 0, fmt.Errorf("idem: Purge batch must be positive, got %d", batch)
	}
	var total int64
	for {
		start := startWatch()
		n, err := s.purgeBatch(ctx, db, batch)
		s.observe(ctx, Event{Kind: EventPurgeBatch, Duration: start.elapsed(), Rows: n, Err: err})
		if err != nil {
			return total, fmt.Errorf("idem: purge %s stopped after deleting %d records: %w; the deleted ones stay deleted, run Purge again", s.table, total, err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

// purgeBatch deletes one batch in a transaction of its own and returns how
// many records it deleted.
func (s *Store) purgeBatch(ctx context.Context, db *sql.DB, batch int) (n int64, err error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: s.q.purgeIsolation})
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	r := micros(s.retention)
	res, err := tx.ExecContext(ctx, s.q.purge, r, r, batch)
	if err != nil {
		return 0, err
	}
	if n, err = res.RowsAffected(); err != nil {
		return 0, err
	}
	return n, tx.Commit()
}
