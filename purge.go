package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Purge deletes the records past retention: completed ones whose response
// was stored longer ago than the retention, and claims whose lease ended
// longer ago than that. It deletes in batches of at most batch rows, each
// in a short statement of its own on db, until none is left, and returns
// how many it deleted. A PROCESSING claim with a live lease is never
// touched, and rows a live transaction holds are skipped (Postgres) or
// waited for briefly (MySQL), so Purge may run from several processes at
// once and beside live traffic.
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
		start := time.Now()
		n, err := s.purgeBatch(ctx, db, batch)
		s.observe(ctx, Event{Kind: EventPurgeBatch, Duration: time.Since(start), Rows: n, Err: err})
		if err != nil {
			return total, fmt.Errorf("idem: purge %s stopped after deleting %d records: %w; the deleted ones stay deleted, run Purge again", s.table, total, err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

// purgeBatch deletes one batch and returns how many records it deleted.
func (s *Store) purgeBatch(ctx context.Context, db *sql.DB, batch int) (int64, error) {
	r := micros(s.retention)
	res, err := db.ExecContext(ctx, s.q.purge, r, r, batch)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
