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
// in a short statement of its own on db, until none is left, and returns
// how many it deleted. A PROCESSING claim with a live lease is never
// touched, and rows a live transaction holds are skipped (Postgres) or
// waited for briefly (MySQL); on SQLite each batch waits for the write lock
// like any writer. So Purge may run from several processes at once and
// beside live traffic.
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
		n, err := s.purgeBatch(ctx, db, batch)
		if err != nil {
			return total, fmt.Errorf("idem: purge %s after %d rows: %w", s.table, total, err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}

// PurgeBatch deletes at most limit records past retention, as Purge does,
// in one statement, and returns how many it deleted. Purge calls it until
// a batch comes back short; call it yourself to pace a purge or to report
// its progress.
func (s *Store) PurgeBatch(ctx context.Context, db *sql.DB, limit int) (int64, error) {
	if s.err != nil {
		return 0, s.err
	}
	if db == nil {
		return 0, errors.New("idem: PurgeBatch needs a *sql.DB, got nil")
	}
	if limit <= 0 {
		return 0, fmt.Errorf("idem: PurgeBatch limit must be positive, got %d", limit)
	}
	n, err := s.purgeBatch(ctx, db, limit)
	if err != nil {
		return n, fmt.Errorf("idem: purge %s: %w", s.table, err)
	}
	return n, nil
}

func (s *Store) purgeBatch(ctx context.Context, db *sql.DB, limit int) (int64, error) {
	r := micros(s.retention)
	res, err := db.ExecContext(ctx, s.q.purge, r, r, limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
