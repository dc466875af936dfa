package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/driver"
)

// Record is a stored idempotency record, as Inspect reads it for a person
// or a tool. Times are UTC, from the database clock.
type Record struct {
	Scope       string
	Key         string
	Operation   string
	Fingerprint string
	Status      Status
	Token       int64     // the fencing token of the current claim
	LeaseUntil  time.Time // when a PROCESSING claim's lease ends
	CreatedAt   time.Time // when the current claim was made
	CompletedAt time.Time // when the response was stored; zero unless completed
	Now         time.Time // the database clock when the record was read
	// Forgotten reports a record past retention: Do treats the key as
	// absent, and Purge deletes the record.
	Forgotten bool
	// Response is the stored response; nil unless Status is
	// [StatusCompleted].
	Response *Response
}

// Inspect reads the record of (scope, key) without locking it or changing
// anything. It returns nil and no error when there is none. An invalid key
// or scope is [ErrInvalidKey] or [ErrInvalidRequest], as for Do.
func (s *Store) Inspect(ctx context.Context, db DBTX, scope, key string) (*Record, error) {
	if db == nil {
		return nil, errors.New("idem: Inspect needs a database handle, got nil")
	}
	return s.inspect(ctx, sqlConn{db, s.dialect}, scope, key)
}

func (s *Store) inspect(ctx context.Context, c driver.Conn, scope, key string) (*Record, error) {
	if err := (Request{Scope: scope, Key: key}).validate(); err != nil {
		return nil, err
	}
	var (
		rec                 = Record{Scope: scope, Key: key}
		lease, created, now int64
		completed, status   sql.NullInt64
		header, body        []byte
	)
	err := c.QueryRow(ctx, s.st.inspect(scope, key, micros(s.retention)),
		&rec.Operation, &rec.Fingerprint, &rec.Status, &rec.Token, &lease, &created, &completed, &now,
		&rec.Forgotten, &status, &header, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idem: inspect key %q: %w", key, err)
	}
	rec.LeaseUntil, rec.CreatedAt, rec.Now = fromMicros(lease), fromMicros(created), fromMicros(now)
	if completed.Valid {
		rec.CompletedAt = fromMicros(completed.Int64)
	}
	if rec.Status == StatusCompleted {
		h, err := decodeHeader(header)
		if err != nil {
			return nil, fmt.Errorf("idem: inspect key %q: %w", key, err)
		}
		rec.Response = &Response{StatusCode: int(status.Int64), Header: h, Body: body}
	}
	return &rec, nil
}

// Stats summarises a [Store]'s table.
type Stats struct {
	// ByStatus counts the records per status; a status without records
	// is absent.
	ByStatus map[Status]int64
	// Total is the number of records.
	Total int64
	// Expired counts the records past retention that Purge would delete now.
	Expired int64
	// Oldest is when the oldest record's claim was made; zero when there is
	// no record.
	Oldest time.Time
	// Now is the database clock when the counts were taken; zero when there
	// is no record.
	Now time.Time
	// TableBytes and IndexBytes are the space the table and its indexes use
	// as the database reports it (an estimate on MySQL), or -1 where it
	// cannot tell.
	TableBytes, IndexBytes int64
}

// Stats counts the [Store]'s records with one scan of the table, and asks the
// database for the table's size. It changes nothing.
func (s *Store) Stats(ctx context.Context, db DBTX) (Stats, error) {
	if db == nil {
		return Stats{}, errors.New("idem: Stats needs a database handle, got nil")
	}
	return s.stats(ctx, sqlConn{db, s.dialect})
}

func (s *Store) stats(ctx context.Context, c driver.Conn) (Stats, error) {
	st := Stats{ByStatus: map[Status]int64{}, TableBytes: -1, IndexBytes: -1}
	err := c.QueryRows(ctx, s.st.stats(micros(s.retention)), func(scan func(...any) error) error {
		var (
			status              Status
			n, oldest, exp, now int64
		)
		if err := scan(&status, &n, &oldest, &exp, &now); err != nil {
			return err
		}
		st.ByStatus[status] = n
		st.Total += n
		st.Expired += exp
		st.Now = fromMicros(now)
		if t := fromMicros(oldest); st.Oldest.IsZero() || t.Before(st.Oldest) {
			st.Oldest = t
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("idem: stats of %s: %w", s.table, err)
	}
	var table, index sql.NullInt64
	if err := c.QueryRow(ctx, s.st.size(), &table, &index); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Stats{}, fmt.Errorf("idem: size of %s: %w", s.table, err)
	}
	if table.Valid {
		st.TableBytes = table.Int64
	}
	if index.Valid {
		st.IndexBytes = index.Int64
	}
	return st, nil
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
