package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Reseal rewrites the stored responses that are not sealed with the key
// the Store's sealer seals with now ([WithSealer]): those of an older key
// after a rotation, and those stored in the clear before there was a
// sealer. It works in batches of at most batch records, oldest expiry
// first, each read, locked, opened, sealed anew and written back in a
// short transaction of its own on db (READ COMMITTED), beside live
// traffic, and returns how many it rewrote. Records past their expiry
// are left as they are: they no longer replay, and purge removes their
// response. A record that cannot be opened (a key the sealer lacks, a
// tampered row) stops it with an error that names the record and the
// key. Records written before the schema version with expiries are left
// as they are: they expire by the Store's retention. The sealer must
// name its keys (as NewAESGCMSealer's does).
//
// A reseal stopped part way (ctx ended, an error) loses at most the
// batch it was in, which rolls back: run it again and it goes on, since
// the records it rewrote are sealed with the current key and are not
// read again. [Store.ResealBatch] runs one batch, to pace a reseal or
// report its progress; [Store.ResealLeft] counts what is left.
func (s *Store) Reseal(ctx context.Context, db *sql.DB, batch int) (int64, error) {
	if db == nil {
		return 0, errors.New("idem: Reseal needs a *sql.DB, got nil")
	}
	return s.ResealOn(ctx, NewSQLRunner(db, nil), batch)
}

// ResealOn is [Store.Reseal] on r, a pool through any driver's adapter.
func (s *Store) ResealOn(ctx context.Context, r Runner, batch int) (int64, error) {
	var (
		total int64
		at    ResealCursor
	)
	for {
		n, next, err := s.ResealBatchOn(ctx, r, at, batch)
		total += n
		if err != nil {
			if e, ok := err.(*Error); ok {
				e.Detail = fmt.Sprintf("stopped after rewriting %d records: %s", total, reason(e.Err))
				e.Hint = s.advice(e.Err, "the rewritten ones stay rewritten, run Reseal again: it goes on with the rest")
			}
			return total, err
		}
		if n < int64(batch) {
			return total, nil
		}
		at = next
	}
}

// ResealCursor is where a reseal goes on: the expiry of the last record
// a batch rewrote. The zero value is the start of the table.
type ResealCursor struct{ expires int64 }

// ResealBatch rewrites at most limit records, as Reseal does, from the
// cursor at (the zero ResealCursor: from the start), in one short
// transaction, and returns how many and the cursor of the next batch.
// Fewer than limit means none is left past the cursor. Reseal calls it
// until a batch comes back short; call it yourself to pace a reseal or
// to report its progress.
func (s *Store) ResealBatch(ctx context.Context, db *sql.DB, at ResealCursor, limit int) (int64, ResealCursor, error) {
	if db == nil {
		return 0, at, errors.New("idem: ResealBatch needs a *sql.DB, got nil")
	}
	return s.ResealBatchOn(ctx, NewSQLRunner(db, nil), at, limit)
}

// ResealBatchOn is [Store.ResealBatch] on r, a pool through any driver's
// adapter.
func (s *Store) ResealBatchOn(ctx context.Context, r Runner, at ResealCursor, limit int) (int64, ResealCursor, error) {
	current, err := s.resealing(r, limit)
	if err != nil {
		return 0, at, err
	}
	n, last, err := s.resealBatch(ctx, r, current, at.expires, limit)
	if err != nil { // the batch rolled back: nothing of it was rewritten
		err = s.probed(ctx, s.conn(r), err)
		return 0, at, &Error{Op: "reseal " + s.table, Err: err, Hint: s.advice(err, "nothing of this batch was rewritten, run it again")}
	}
	return n, ResealCursor{last}, nil
}

// ResealLeft counts the records Reseal would rewrite now: completed, not
// past their expiry, and not sealed with the current key. It reads the
// whole table, and changes nothing.
func (s *Store) ResealLeft(ctx context.Context, db DBTX) (int64, error) {
	if isNil(db) {
		return s.ResealLeftOn(ctx, nil)
	}
	return s.ResealLeftOn(ctx, sqlConn{db})
}

// ResealLeftOn is [Store.ResealLeft] on db, through any driver's adapter
// (a Runner is one: a pool works).
func (s *Store) ResealLeftOn(ctx context.Context, db Conn) (int64, error) {
	if isNil(db) {
		return 0, errors.New("idem: ResealLeft needs a database handle, got nil")
	}
	current, err := s.resealing(db, 1)
	if err != nil {
		return 0, err
	}
	var n int64
	c := s.conn(db)
	if err := c.queryRow(ctx, s.st.query(s.st.ResealLeft, &values{sealedKey: current}), &n); err != nil {
		return 0, s.inspectError(ctx, c, "count the records to reseal", err)
	}
	return n, nil
}

// resealing returns the key a reseal seals with, refusing a nil handle,
// a limit that is not positive and a sealer that does not name its keys.
func (s *Store) resealing(h any, limit int) (string, error) {
	switch {
	case isNil(h):
		return "", errors.New("idem: Reseal needs a pool, got nil")
	case limit <= 0:
		return "", fmt.Errorf("idem: Reseal batch must be positive, got %d", limit)
	}
	named, ok := s.sealer.(interface{ KeyID() string })
	if !ok {
		return "", errors.New("idem: Reseal needs a sealer that names its keys (WithSealer with NewAESGCMSealer's): it rewrites the records sealed with other keys than the current one")
	}
	return named.KeyID(), nil
}

// resealBatch rewrites at most limit records not sealed with current, of
// expiry from on, in one transaction, and returns how many and the expiry
// of the last.
func (s *Store) resealBatch(ctx context.Context, r Runner, current string, from int64, limit int) (n, last int64, err error) {
	err = InTx(ctx, r, s.st.PurgeIsolation, func(tx Tx) error {
		c := s.conn(tx)
		type sealedRecord struct {
			req            Request
			token, expires int64
			rec            keyRecord
		}
		var recs []sealedRecord
		q := s.st.query(s.st.ResealRead, &values{from: from, sealedKey: current, limit: limit})
		err := c.queryRows(ctx, q, func(scan func(...any) error) error {
			var r sealedRecord
			if err := scan(&r.req.Scope, &r.req.Key, &r.req.Operation, &r.token, &r.expires, &r.rec.sealedKey.String, &r.rec.header, &r.rec.body); err != nil {
				return err
			}
			r.rec.sealedKey.Valid = r.rec.sealedKey.String != ""
			recs = append(recs, r)
			return nil
		})
		if err != nil {
			return err
		}
		n, last = 0, from
		for _, r := range recs {
			header, body, err := s.open(r.req, r.rec.sealedKey.String, r.rec.header, r.rec.body)
			if err != nil {
				return err
			}
			sealed, err := s.sealStored(r.req, header, body)
			if err != nil {
				return err
			}
			w := s.st.query(s.st.ResealWrite, &values{req: r.req, token: r.token, body: sealed, sealedKey: current})
			if _, err := c.exec(ctx, w); err != nil {
				return err
			}
			n, last = n+1, r.expires
		}
		return nil
	})
	return n, last, err
}
