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
// traffic, and returns how many it rewrote. A record that cannot be
// opened (a key the sealer lacks, a tampered row) stops it with an error
// that names the record and the key. Records written before the schema
// version with expiries are left as they are: they expire by the Store's
// retention. The sealer must name its keys (as NewAESGCMSealer's does).
func (s *Store) Reseal(ctx context.Context, db *sql.DB, batch int) (int64, error) {
	if db == nil {
		return 0, errors.New("idem: Reseal needs a *sql.DB, got nil")
	}
	return s.ResealOn(ctx, NewSQLRunner(db, nil), batch)
}

// ResealOn is [Store.Reseal] on r, a pool through any driver's adapter.
func (s *Store) ResealOn(ctx context.Context, r Runner, batch int) (int64, error) {
	switch {
	case isNil(r):
		return 0, errors.New("idem: Reseal needs a pool, got nil")
	case batch <= 0:
		return 0, fmt.Errorf("idem: Reseal batch must be positive, got %d", batch)
	}
	named, ok := s.sealer.(interface{ KeyID() string })
	if !ok {
		return 0, errors.New("idem: Reseal needs a sealer that names its keys (WithSealer with NewAESGCMSealer's): it rewrites the records sealed with other keys than the current one")
	}
	current := named.KeyID()
	var total, from int64
	for {
		n, last, err := s.resealBatch(ctx, r, current, from, batch)
		total += n
		if err != nil {
			err = s.probed(ctx, s.conn(r), err)
			return total, &Error{Op: "reseal " + s.table, Err: err,
				Detail: fmt.Sprintf("stopped after rewriting %d records: %s", total, reason(err)),
				Hint:   s.advice(err, "the rewritten ones stay rewritten, run Reseal again")}
		}
		if n < int64(batch) {
			return total, nil
		}
		from = last
	}
}

// resealBatch rewrites at most limit records not sealed with current, of
// expiry from on, in one transaction, and returns how many and the expiry
// of the last.
func (s *Store) resealBatch(ctx context.Context, r Runner, current string, from int64, limit int) (n, last int64, err error) {
	err = InTx(ctx, r, s.st.purgeIsolation, func(tx Tx) error {
		c := s.conn(tx)
		type sealedRecord struct {
			req            Request
			token, expires int64
			rec            record
		}
		var recs []sealedRecord
		q := s.st.query(s.st.resealRead, &values{from: from, sealedKey: current, limit: limit})
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
			w := s.st.query(s.st.resealWrite, &values{req: r.req, token: r.token, body: sealed, sealedKey: current})
			if _, err := c.exec(ctx, w); err != nil {
				return err
			}
			n, last = n+1, r.expires
		}
		return nil
	})
	return n, last, err
}
