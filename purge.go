package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Purge deletes the records past their expiry: completed ones whose
// response has passed its retention (the request's, or the Store's), and
// claims whose lease ended longer ago than that. A completed record whose
// key memory is still running keeps its key: it loses its response and
// stays as a tombstone ([StatusExpired]) until its forget time, then it
// is deleted; one first met after its forget time is deleted at once. The
// forget time is the record's own, stored at its completion from the key
// memory of its request or Store ([Request.KeyMemory], [WithKeyMemory]),
// so a Purge of a Store with another key memory, or none, honours it;
// only the records written before the schema version with forget times
// (by an earlier release) keep their key for this Store's key memory. It
// works in batches of at most batch rows, oldest expiry first, each a
// read of what it will change and a DELETE (and an UPDATE for the
// tombstones) in a short transaction of its own on db (READ COMMITTED on
// PostgreSQL and MySQL, retried like [RunTx] on a deadlock or a busy
// database), until a batch comes back short, and returns how many
// records it deleted or made tombstones ([Store.PurgeBatchDetail] tells
// the two apart). A PROCESSING claim with a live lease is never touched,
// and rows a live transaction holds are passed over (PostgreSQL, MySQL
// and MariaDB: SKIP LOCKED) or waited for (TiDB, up to
// innodb_lock_wait_timeout); on SQLite each batch waits for the write
// lock like any writer. So Purge may run from several processes at once
// and beside live traffic. Each batch starts where the Store's previous
// batch ended, so that it does not walk again the rows earlier batches
// deleted; a record passed over (a row that was locked, or a live claim
// past its expiry) is purged by the next sweep, which starts from the
// oldest record after a batch that came back short: a batch that passed
// a record over moves its start past the window's last expiry, so that
// no batch size makes Purge read the same held rows again and again.
// Purge and PurgeBatch may also run from several goroutines on one Store:
// batches that run at once take consecutive windows of the table and do
// not wait for each other's rows, so a backlog is purged faster, at some
// cost to the traffic beside it. Records written before the schema
// version with expiries (by an earlier release) expire by the Store's
// retention, and are purged first, in the order they were made. Each
// batch is reported to the [Store]'s [Observer]. See docs/operations.md
// for batch sizes, cadence and workers.
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
		p, more, err := s.purgeBatch(ctx, r, batch)
		total += p.Records()
		if err != nil {
			err = s.probed(ctx, s.conn(r), err)
			return total, &Error{Op: "purge " + s.table, Err: err,
				Detail: fmt.Sprintf("stopped after deleting or making tombstones of %d records: %s", total, reason(err)),
				Hint:   s.advice(err, "what was purged stays purged, run Purge again")}
		}
		if !more {
			return total, nil
		}
	}
}

// Purged is what a purge batch did: the records it deleted, and those it
// made tombstones (their response dropped, their key kept to its forget
// time: [StatusExpired]).
type Purged struct {
	Deleted    int64
	Tombstoned int64
}

// Records is how many records the batch changed: deleted or made
// tombstones.
func (p Purged) Records() int64 { return p.Deleted + p.Tombstoned }

// PurgeBatch deletes at most limit records past their expiry (or makes
// them tombstones), as Purge does, in one short transaction, and returns
// how many. Purge calls it until a batch comes back short; call it
// yourself to pace a purge or to report its progress.
func (s *Store) PurgeBatch(ctx context.Context, db *sql.DB, limit int) (int64, error) {
	if db == nil {
		return 0, errors.New("idem: PurgeBatch needs a *sql.DB, got nil")
	}
	return s.PurgeBatchOn(ctx, NewSQLRunner(db, nil), limit)
}

// PurgeBatchOn is [Store.PurgeBatch] on r, a pool through any driver's
// adapter.
func (s *Store) PurgeBatchOn(ctx context.Context, r Runner, limit int) (int64, error) {
	p, err := s.PurgeBatchDetail(ctx, r, limit)
	return p.Records(), err
}

// PurgeBatchDetail is [Store.PurgeBatchOn] that tells the records it
// deleted from those it made tombstones.
func (s *Store) PurgeBatchDetail(ctx context.Context, r Runner, limit int) (Purged, error) {
	if r == nil {
		return Purged{}, errors.New("idem: PurgeBatch needs a pool, got nil")
	}
	if limit <= 0 {
		return Purged{}, fmt.Errorf("idem: PurgeBatch limit must be positive, got %d", limit)
	}
	p, _, err := s.purgeBatch(ctx, r, limit)
	if err != nil {
		err = s.probed(ctx, s.conn(r), err)
		return p, &Error{Op: "purge " + s.table, Err: err, Hint: s.advice(err, "what this batch purged before it failed stays purged, run it again")}
	}
	return p, nil
}

// purgeBatch purges one batch of at most limit records, in transactions
// of the dialect's purge isolation level, retried as RunTx retries (a
// deadlock on MySQL, a busy database on SQLite: the batch is safe to run
// again), and reports it to the Observer. The records without an expiry
// come first; what the batch has room for after them is taken from the
// expiry's order. more reports that its window was full: the sweep goes
// on.
func (s *Store) purgeBatch(ctx context.Context, r Runner, limit int) (p Purged, more bool, err error) {
	start := startWatch()
	defer func() {
		s.observe(ctx, Event{Kind: EventPurgeBatch, Duration: start.elapsed(), Rows: p.Records(), Err: err})
	}()
	v := values{retention: micros(s.retention), keyMemory: micros(s.keyMemory), limit: limit}
	legacy, err := s.purgeWindow(ctx, r, &s.legacySweep, s.st.LegacyWindow, s.st.legacyStart, v, false)
	if err != nil {
		return p, false, err
	}
	if legacy.rows > 0 {
		if p, err = s.purgeIn(ctx, r, legacy, func(c conn, v *values) (Purged, error) {
			n, err := c.exec(ctx, s.st.query(s.st.LegacyPurge, v))
			return Purged{Deleted: n}, err
		}, v); err != nil || legacy.rows == int64(limit) {
			return p, err == nil, err
		}
	}
	v.limit = limit - int(legacy.rows)
	due, err := s.purgeWindow(ctx, r, &s.expirySweep, s.st.PurgeWindow, s.st.purgeStart, v, true)
	if err != nil || due.rows == 0 {
		return p, false, err
	}
	q, err := s.purgeIn(ctx, r, due, func(c conn, v *values) (Purged, error) {
		return s.purgeDue(ctx, c, v, due.kept > 0)
	}, v)
	p.Deleted += q.Deleted
	p.Tombstoned += q.Tombstoned
	return p, err == nil && due.rows == int64(v.limit), err
}

// purgeDue runs a batch's purge and, where its window holds records to
// make tombstones of (strip), its strip through c. Where the dialect
// has purgeHeld (MySQL's), whose purge and strip wait for a row another
// transaction holds, it runs them with every lock wait bounded to
// nothing (MariaDB; MySQL's bound is at least a second), and after a wait
// ran out, what was left of them again, as purgeHeld and stripHeld,
// which pass over held rows; it then sets v.passed, and purgeIn moves
// the cursor past the window.
func (s *Store) purgeDue(ctx context.Context, c conn, v *values, tombstones bool) (p Purged, err error) {
	purge, strip := s.st.query(s.st.Purge, v), s.st.query(s.st.Strip, v)
	purged := false
	run := func() (err error) {
		if !purged {
			if p.Deleted, err = c.exec(ctx, purge); err != nil {
				return err
			}
			purged = true
		}
		if tombstones {
			p.Tombstoned, err = c.exec(ctx, strip)
		}
		return err
	}
	lw := s.dialect.lockWaiter()
	if s.st.purgeHeld.SQL == "" || lw == nil {
		return p, run()
	}
	timedOut, err := lw(ctx, c, 0, run)
	if !timedOut {
		return p, err
	}
	v.passed = true
	purge, strip = s.st.query(s.st.purgeHeld, v), s.st.query(s.st.stripHeld, v)
	return p, run()
}

// window is a part of a sweep that a batch takes: from the cursor where
// it starts to where the cursor moved (to: 0 when the window was short
// and the sweep ended), the records it holds, and the first and last of
// their expiries (or created_at), which bound the batch's statements,
// and how many of its records strip would make tombstones (the expiry
// sweep's only).
type window struct {
	sweep       *sweep
	from, to    int64
	first, last int64
	rows, kept  int64
}

// purgeIn runs purge on w in one transaction. When it fails, the cursor
// goes back so that the next batch takes w again. When it changed fewer
// records than the window held, or says it passed held rows over
// (v.passed), it passed some over (rows another transaction held, live
// claims past their expiry), and the next window
// would start at them again, the cursor being inclusive: a window of
// such rows alone would fill every batch, and none would end the sweep.
// So the cursor moves past the window's last expiry, where the next
// window starts; what it passes over, the next sweep purges. (A spanned
// window, TiDB's, starts past the last one's end already.)
func (s *Store) purgeIn(ctx context.Context, r Runner, w window, purge func(c conn, v *values) (Purged, error), v values) (p Purged, err error) {
	v.from, v.to = w.first, w.last
	err = InTx(ctx, r, s.st.PurgeIsolation, func(tx Tx) (err error) {
		p, err = purge(s.conn(tx), &v)
		return err
	})
	if err != nil {
		w.sweep.cursor.CompareAndSwap(w.to, w.from)
		return Purged{}, err
	}
	if s.st.purgeStart.SQL == "" && w.to != 0 && (v.passed || p.Records() < w.rows) {
		w.sweep.cursor.CompareAndSwap(w.to, w.to+1)
	}
	return p, nil
}

// purgeWindow takes the next window of sw for a batch of v.limit records:
// it reads, with q from the cursor on, how many records the batch would
// purge and where the last of them is (its expiry, or for the records
// without one its created_at), and with kept how many of them strip would
// make tombstones, and moves the cursor there, to the next
// batch's start. A window shorter than the limit ends the sweep: the
// cursor goes back to the beginning. Where the dialect bounds a window's
// read ahead (start is its statement, TiDB's), spanned reads it.
//
// A deleted row stays in the table's indexes until the database reclaims
// it (InnoDB's purge thread, a VACUUM, TiDB's GC), and a batch that
// started at the beginning would walk every such row before the first it
// can delete; with the cursor, a sweep through the table reads each row
// once. A record the cursor has passed (one that was locked) is purged by
// the next sweep.
//
// The read locks nothing, and the cursor moves only if no other batch of
// the Store moved it meanwhile (else the window is read again from where
// that batch left it). So batches that run at once, from several
// goroutines, purge consecutive windows instead of waiting for each
// other's rows.
func (s *Store) purgeWindow(ctx context.Context, r Runner, sw *sweep, q, start Statement, v values, kept bool) (window, error) {
	for {
		w := window{sweep: sw, from: sw.cursor.Load()}
		w.first = w.from
		into := []any{&w.rows, &w.last}
		if kept {
			into = append(into, &w.kept)
		}
		err := InTx(ctx, r, s.st.PurgeIsolation, func(tx Tx) error {
			c := s.conn(tx)
			if start.SQL != "" {
				return s.spanned(ctx, c, sw, q, start, &w, v, into)
			}
			v.from = w.from
			return c.queryRow(ctx, s.st.query(q, &v), into...)
		})
		if err != nil {
			return window{}, err
		}
		if w.rows == int64(v.limit) {
			w.to = w.last
		}
		if sw.cursor.CompareAndSwap(w.from, w.to) {
			return w, nil
		}
	}
}

// firstSpan is the span a spanned window's first read covers when its
// sweep has no full window yet: a second of expiries.
const firstSpan = int64(time.Second / time.Microsecond)

// spanned reads w through c where the dialect bounds a window's read
// ahead: TiDB's embedded storage reads the whole range a coprocessor
// request may cover, whatever its LIMIT, so a window read from the cursor
// to now would read the whole backlog, each batch again. At the start of
// a sweep it reads where the first record due is (start); then a window
// from there, covering the span the sweep's last full window needed,
// twice over: read with q, which bounds its scan there and returns the
// database clock. A read that finds fewer records than the limit reads
// again over four times the span, until it finds the limit or covers up
// to the clock, where a short window ends the sweep. A window starts past
// the last record of the one before, whose batch takes every record up
// to it, however many share its expiry: so two batches at once never
// take one record, and each may take a few more than the limit.
func (s *Store) spanned(ctx context.Context, c conn, sw *sweep, q, start Statement, w *window, v values, into []any) error {
	if w.from > 0 {
		w.first = w.from + 1 // past the last window's last record, whose batch takes every record up to it
	} else if err := c.queryRow(ctx, s.st.query(start, &v), &w.first); err != nil || w.first == 0 {
		return err // none due
	}
	span := sw.span.Load()
	if span <= 0 {
		span = firstSpan
	}
	for {
		var now int64
		v.from, v.upto = w.first, w.first+span
		if err := c.queryRow(ctx, s.st.query(q, &v), append(into, &now)...); err != nil {
			return err
		}
		switch {
		case w.rows == int64(v.limit):
			sw.span.Store(2*(w.last-w.first) + 1)
			return nil
		case v.upto > now:
			return nil
		}
		span *= 4
	}
}
