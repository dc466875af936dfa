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
// left as it was before.
func (s *Store) claim(ctx context.Context, db DBTX, req Request, token *int64) (*Result, error) {
	if !s.hasLockWait {
		return s.acquire(ctx, db, req, token)
	}
	var replay *Result
	timedOut, err := s.dialect.(lockWaiter).boundLockWait(ctx, db, s.q, s.lockWait, func() error {
		var err error
		replay, err = s.acquire(ctx, db, req, token)
		return err
	})
	if timedOut {
		return nil, inFlight(s.lockWait)
	}
	return replay, err
}

// acquire claims (Scope, Key) inside db and returns nil, or returns the
// stored result to replay. db is the caller's transaction in Do and a short
// transaction of its own in Begin. The insert waits on the row lock of any
// other open transaction that holds the key, so of concurrent requests
// exactly one proceeds; the others see its committed outcome. A record that
// is forgotten, released or whose lease expired is taken over with an
// update fenced on the token read and on the record still being free, so
// two takeovers of one record have one winner, and a claim completed or
// extended since the read is not taken.
//
// When token is not nil, acquire stores there the token of the claim it
// made (Begin); Do passes nil and runs no statement for it.
func (s *Store) acquire(ctx context.Context, db DBTX, req Request, token *int64) (replay *Result, err error) {
	lease, start := micros(s.lease), startWatch()
	for range maxContention {
		ok, err := s.claimRow(ctx, db, req, true, token,
			req.Scope, req.Key, req.Operation, req.Fingerprint, lease)
		if err != nil {
			return nil, stmtErr("claim", req, err)
		}
		if ok {
			return nil, nil
		}
		rec, found, err := s.get(ctx, db, req)
		if err != nil {
			return nil, err
		}
		if !found {
			continue // deleted since the insert saw it: claim it afresh
		}
		if !rec.forgotten {
			if rec.operation != req.Operation || rec.fingerprint != req.Fingerprint {
				return nil, mismatch(req, rec)
			}
			switch {
			case rec.status == statusCompleted:
				return &Result{Response: rec.resp, Replayed: true}, nil
			case rec.status == statusProcessing && rec.leaseLeft > 0:
				return nil, inFlight(rec.leaseLeft)
			}
		}
		ok, err = s.claimRow(ctx, db, req, false, token,
			req.Operation, req.Fingerprint, lease, req.Scope, req.Key, rec.token, micros(s.retention))
		if err != nil {
			return nil, stmtErr("take over", req, err)
		}
		if ok {
			s.observe(ctx, Event{Kind: EventTakeover, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed(), Token: rec.token})
			return nil, nil
		}
		// Another request took the record over, or its owner completed or
		// extended it, since the read: look again.
	}
	return nil, errContended
}

// claimRow runs the insert (insert true) or the takeover and reports
// whether it claimed the record. With token not nil it also learns the new
// token: from the same statement where the dialect can return it, else by
// reading it in db.
func (s *Store) claimRow(ctx context.Context, db DBTX, req Request, insert bool, token *int64, args ...any) (bool, error) {
	query, withToken := s.q.takeover, s.q.takeoverToken
	if insert {
		query, withToken = s.q.insert, s.q.insertToken
	}
	if token != nil && withToken != "" {
		err := s.queryRow(ctx, db, withToken, args...).Scan(token)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, sql.ErrNoRows):
			return false, nil
		case insert:
			return s.dialect.inserted(nil, err)
		}
		return false, err
	}
	res, err := s.exec(ctx, db, query, args...)
	var ok bool
	if insert {
		ok, err = s.dialect.inserted(res, err)
	} else if err == nil {
		var n int64
		n, err = res.RowsAffected()
		ok = n == 1
	}
	if err != nil || !ok || token == nil {
		return ok, err
	}
	return true, s.queryRow(ctx, db, s.q.token, req.Scope, req.Key).Scan(token)
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
