package idem

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// The values of the status column.
const (
	statusProcessing = "processing"
	statusCompleted  = "completed"
	statusReleased   = "released"
)

// maxContention bounds how often acquire looks again after losing a race
// (the record vanished, or another request took it over first).
const maxContention = 4

// errContended is returned when acquire lost maxContention races in a row.
// IsRetryable reports true for it: a retry of the transaction will see the
// winner's result.
var errContended = errors.New("idem: the key changed hands repeatedly while being claimed; retry the transaction")

// record is a row of the table as acquire reads it.
type record struct {
	operation   string
	fingerprint string
	status      string
	token       int64
	forgotten   bool          // past retention: counts as absent
	leaseLeft   time.Duration // by the database clock; <= 0 once expired
	resp        Response
}

// claim is acquire, with its lock waits bounded when the Store has
// WithLockTimeout: a wait that runs out is an *InFlightError, and db is
// left as it was before. A statement of the bound that fails is reported
// like one of acquire's.
func (s *Store) claim(ctx context.Context, db DBTX, req Request, begin bool) (*Result, int64, error) {
	if !s.hasLockWait {
		return s.acquire(ctx, db, req, begin)
	}
	var (
		replay     *Result
		token      int64
		acquireErr error
	)
	timedOut, err := s.dialect.(lockWaiter).boundLockWait(ctx, db, s.q, s.lockWait, func() error {
		replay, token, acquireErr = s.acquire(ctx, db, req, begin)
		return acquireErr
	})
	switch {
	case timedOut:
		return nil, 0, inFlight(s.lockWait)
	case err != nil && err != acquireErr:
		return nil, 0, stmtErr("claim", req, err)
	}
	return replay, token, err
}

// restampAfter is how long a claim statement may have run before its claim
// was granted (it waited for another transaction that held the key) and
// still keep the lease it computed when it started; past it, Begin moves
// the lease's end to a full lease from now.
const restampAfter = 10 * time.Millisecond

// acquire claims (Scope, Key) inside db and returns the claim's token, or
// returns the stored result to replay. db is the caller's transaction in Do
// and a short transaction of its own in Begin. The insert waits on the row
// lock of any other open transaction that holds the key, so of concurrent
// requests exactly one proceeds; the others see its committed outcome. A
// record that is forgotten, released or whose lease expired is taken over
// with an update fenced on the token read and on the record still being
// free, so two takeovers of one record have one winner, and a claim
// completed or extended since the read is not taken.
//
// The token fences every later statement on the claim. For Begin (begin
// true), whose claim outlives db, a claim statement that waited longer than
// restampAfter for the key has its lease counted again from now, so that a
// claim is never committed with its lease already run out.
func (s *Store) acquire(ctx context.Context, db DBTX, req Request, begin bool) (replay *Result, token int64, err error) {
	lease, start := micros(s.lease), startWatch()
	for range maxContention {
		ok, token, waited, err := s.claimRow(ctx, db, req, true,
			req.Scope, req.Key, req.Operation, req.Fingerprint, lease)
		if err != nil {
			return nil, 0, stmtErr("claim", req, err)
		}
		if ok {
			return nil, token, s.restamp(ctx, db, req, begin, token, waited)
		}
		rec, found, err := s.get(ctx, db, req)
		if err != nil {
			return nil, 0, err
		}
		if !found {
			continue // deleted since the insert saw it: claim it afresh
		}
		if !rec.forgotten {
			if rec.operation != req.Operation || rec.fingerprint != req.Fingerprint {
				return nil, 0, mismatch(req, rec)
			}
			switch {
			case rec.status == statusCompleted:
				return &Result{Response: rec.resp, Replayed: true}, 0, nil
			case rec.status == statusProcessing && rec.leaseLeft > 0:
				return nil, 0, inFlight(rec.leaseLeft)
			}
		}
		ok, token, waited, err = s.claimRow(ctx, db, req, false,
			req.Operation, req.Fingerprint, lease, req.Scope, req.Key, rec.token, micros(s.retention))
		if err != nil {
			return nil, 0, stmtErr("take over", req, err)
		}
		if ok {
			s.observe(ctx, Event{Kind: EventTakeover, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed(), Token: rec.token})
			return nil, token, s.restamp(ctx, db, req, begin, token, waited)
		}
		// Another request took the record over, or its owner completed or
		// extended it, since the read: look again.
	}
	return nil, 0, errContended
}

// restamp moves the lease of Begin's claim to a full lease from now when
// its statement waited longer than restampAfter, fenced on its token.
func (s *Store) restamp(ctx context.Context, db DBTX, req Request, begin bool, token int64, waited time.Duration) error {
	if !begin || waited <= restampAfter {
		return nil
	}
	res, err := s.exec(ctx, db, s.q.extend, micros(s.lease), req.Scope, req.Key, token)
	if err != nil {
		return stmtErr("count the lease from the claim", req, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return stmtErr("count the lease from the claim", req, errors.Join(err, fmt.Errorf("%d records changed, want 1", n)))
	}
	return nil
}

// claimRow runs the insert (insert true) or the takeover and reports
// whether it claimed the record, the claim's token and how long after the
// statement's start the claim was granted: from the same statement where
// the dialect can return them, else by reading them in db.
func (s *Store) claimRow(ctx context.Context, db DBTX, req Request, insert bool, args ...any) (ok bool, token int64, waited time.Duration, err error) {
	query, withToken := s.q.takeover, s.q.takeoverToken
	if insert {
		query, withToken = s.q.insert, s.q.insertToken
	}
	var lag int64
	if withToken != "" {
		err := s.queryRow(ctx, db, withToken, args...).Scan(&token, &lag)
		switch {
		case err == nil:
			return true, token, time.Duration(lag) * time.Microsecond, nil
		case errors.Is(err, sql.ErrNoRows):
			return false, 0, 0, nil
		case insert:
			ok, err := s.dialect.inserted(nil, err)
			return ok, 0, 0, err
		}
		return false, 0, 0, err
	}
	res, err := s.exec(ctx, db, query, args...)
	if insert {
		ok, err = s.dialect.inserted(res, err)
	} else if err == nil {
		var n int64
		n, err = res.RowsAffected()
		ok = n == 1
	}
	if err != nil || !ok {
		return ok, 0, 0, err
	}
	err = s.queryRow(ctx, db, s.q.token, req.Scope, req.Key).Scan(&token, &lag)
	return err == nil, token, time.Duration(lag) * time.Microsecond, err
}

func mismatch(req Request, rec record) error {
	what := "payload (Fingerprint)"
	if rec.operation != req.Operation {
		what = fmt.Sprintf("operation %q", rec.operation)
	}
	return fmt.Errorf("%w: key %q in scope %q was first used with another %s; use a new key for a new request", ErrMismatch, req.Key, req.Scope, what)
}

// get reads the record of (Scope, Key); found is false when there is none.
func (s *Store) get(ctx context.Context, db DBTX, req Request) (rec record, found bool, err error) {
	var (
		leaseLeft int64
		status    sql.NullInt64
		header    []byte
	)
	err = s.queryRow(ctx, db, s.q.get, micros(s.retention), req.Scope, req.Key).Scan(
		&rec.operation, &rec.fingerprint, &rec.status, &rec.token, &rec.forgotten, &leaseLeft,
		&status, &header, &rec.resp.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, stmtErr("read the record", req, err)
	}
	rec.leaseLeft = time.Duration(leaseLeft) * time.Microsecond
	rec.resp.StatusCode = int(status.Int64)
	if rec.resp.Header, err = decodeHeader(header); err != nil {
		return record{}, false, fmt.Errorf("idem: read the record for key %q in scope %q: %w (not written by idem?); delete the record by hand (docs/operations.md) or wait for it to pass retention", req.Key, req.Scope, err)
	}
	return rec, true, nil
}

// micros is d in whole microseconds, rounded up.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// headerFormat is the first byte of an encoded header, so that the
// encoding can change without misreading old rows.
const headerFormat = 1

// encodeHeader encodes h byte for byte: names in sorted order, each with its
// values in order, every string length-prefixed. A nil header encodes as nil.
func encodeHeader(h http.Header) []byte {
	if h == nil {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 1 + binary.MaxVarintLen64
	for name, vs := range h {
		names = append(names, name)
		size += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range vs {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerFormat)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		vs := h[name]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errCorruptHeader = errors.New("stored response header is corrupt")

// decodeHeader is the inverse of encodeHeader.
func decodeHeader(b []byte) (http.Header, error) {
	if b == nil {
		return nil, nil
	}
	if len(b) == 0 || b[0] != headerFormat {
		return nil, errCorruptHeader
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	h := make(http.Header, min(n, uint64(len(d.b))))
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := d.string()
		count := d.uvarint()
		vs := make([]string, 0, min(count, uint64(len(d.b))))
		for j := uint64(0); j < count && d.err == nil; j++ {
			vs = append(vs, d.string())
		}
		h[name] = vs
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errCorruptHeader
	}
	return h, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorruptHeader
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errCorruptHeader
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
