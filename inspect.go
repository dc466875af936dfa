package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
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
	// Forgotten reports a record past its expiry (and, for a completed
	// one, past its forget time: its own, or for a record of a release
	// before forget times its expiry plus the Store's key memory): Do
	// treats the key as absent, and Purge deletes the record.
	Forgotten bool
	// Expired reports a record whose response is gone: past its
	// retention, or kept by the key memory ([StatusExpired]). Do refuses
	// the key ([ErrExpired]) until it is Forgotten.
	Expired bool
	// ExpiresAt is when the record's response stops replaying, or its
	// claim may be forgotten (for a record kept by the key memory: when
	// the key is forgotten).
	ExpiresAt time.Time
	// SealedKey names the key the stored response is sealed with
	// ([WithSealer]); "" for one stored in the clear.
	SealedKey string
	// Response is the stored response; nil unless Status is
	// [StatusCompleted], and for a sealed one when the Store has no
	// sealer (a sealer that cannot open it is an error of Inspect's).
	Response *Response
	// Reference is the reference the request recorded to what it created
	// ([Response.Reference]), kept in a tombstone ([StatusExpired]) too;
	// "" when there is none, and for a sealed one that the Store cannot
	// open (ReferenceSealed then reports it).
	Reference string
	// ReferenceSealed reports a sealed reference the Store could not
	// open: it has no sealer, or not the key.
	ReferenceSealed bool
}

// Inspect reads the record of (scope, key) without locking it or changing
// anything. It returns nil and no error when there is none. An invalid key
// or scope is [ErrInvalidKey] or [ErrInvalidRequest], as for Do.
func (s *Store) Inspect(ctx context.Context, db DBTX, scope, key string) (*Record, error) {
	if isNil(db) {
		return s.InspectOn(ctx, nil, scope, key)
	}
	return s.InspectOn(ctx, sqlConn{db}, scope, key)
}

// InspectOn is [Store.Inspect] on db, through any driver's adapter (a
// Runner is one: a pool works).
func (s *Store) InspectOn(ctx context.Context, db Conn, scope, key string) (*Record, error) {
	if isNil(db) {
		return nil, errors.New("idem: Inspect needs a database handle, got nil")
	}
	req := Request{Scope: scope, Key: key}
	if err := req.validate(); err != nil {
		return nil, err
	}
	rec := Record{Scope: scope, Key: key}
	var cols recordColumns
	q := s.st.query(s.st.Inspect, &values{req: req, retention: micros(s.retention), keyMemory: micros(s.keyMemory)})
	err := s.conn(db).queryRow(ctx, q, cols.dest(&rec)...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err == nil {
		err = s.fill(&cols, &rec)
	}
	if err != nil {
		return nil, s.inspectError(ctx, s.conn(db), fmt.Sprintf("inspect key %q in scope %q", key, scope), err)
	}
	return &rec, nil
}

// InspectKey reads the records of key in every scope, at most limit of
// them, in the order of their scopes' bytes, without locking or changing
// anything: for a person who has a client's key but not its scope. The
// table is indexed by (scope, key), so this reads all of it; use Inspect
// when the scope is known. It returns no records and no error when no
// scope has the key. An invalid key is [ErrInvalidKey], as for Do.
func (s *Store) InspectKey(ctx context.Context, db DBTX, key string, limit int) ([]Record, error) {
	if isNil(db) {
		return s.InspectKeyOn(ctx, nil, key, limit)
	}
	return s.InspectKeyOn(ctx, sqlConn{db}, key, limit)
}

// InspectKeyOn is [Store.InspectKey] on db, through any driver's adapter
// (a Runner is one: a pool works).
func (s *Store) InspectKeyOn(ctx context.Context, db Conn, key string, limit int) ([]Record, error) {
	if isNil(db) {
		return nil, errors.New("idem: InspectKey needs a database handle, got nil")
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("idem: InspectKey limit must be positive, got %d", limit)
	}
	var recs []Record
	q := s.st.query(s.st.InspectKey, &values{req: Request{Key: key}, retention: micros(s.retention), keyMemory: micros(s.keyMemory), limit: limit})
	err := s.conn(db).queryRows(ctx, q, func(scan func(...any) error) error {
		rec := Record{Key: key}
		var cols recordColumns
		if err := scan(append([]any{&rec.Scope}, cols.dest(&rec)...)...); err != nil {
			return err
		}
		if err := s.fill(&cols, &rec); err != nil {
			return err
		}
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return nil, s.inspectError(ctx, s.conn(db), fmt.Sprintf("inspect key %q in every scope", key), err)
	}
	return recs, nil
}

// recordColumns are the columns of the inspect statements that are not
// read straight into a Record.
type recordColumns struct {
	lease, created, now, expires int64
	completed, status            sql.NullInt64
	header, body, ref            []byte
}

// dest is where the inspect statements' columns go, in their order.
func (c *recordColumns) dest(rec *Record) []any {
	return []any{&rec.Operation, &rec.Fingerprint, &rec.Status, &rec.Token, &c.lease, &c.created, &c.completed, &c.now,
		&rec.Forgotten, &rec.Expired, &c.expires, &c.status, &c.header, &c.body, &rec.SealedKey, &c.ref}
}

// fill puts the columns dest read into rec, with the response opened
// when the Store's sealer can open it.
func (s *Store) fill(c *recordColumns, rec *Record) error {
	rec.LeaseUntil, rec.CreatedAt, rec.Now, rec.ExpiresAt = fromMicros(c.lease), fromMicros(c.created), fromMicros(c.now), fromMicros(c.expires)
	if c.completed.Valid {
		rec.CompletedAt = fromMicros(c.completed.Int64)
	}
	req := Request{Scope: rec.Scope, Key: rec.Key, Operation: rec.Operation}
	ref, err := s.openRef(req, c.ref)
	rec.Reference, rec.ReferenceSealed = ref, err != nil
	if rec.Status != StatusCompleted || rec.SealedKey != "" && s.sealer == nil {
		return nil
	}
	resp, err := s.response(req, keyRecord{code: c.status, header: c.header, body: c.body, sealedKey: sql.NullString{String: rec.SealedKey, Valid: rec.SealedKey != ""}, ref: c.ref})
	if err != nil {
		return err
	}
	rec.Response = &resp
	return nil
}

// inspectError is the error of a read of the table for a person (what),
// with what to do when the database says the table is not there or not
// idem's.
func (s *Store) inspectError(ctx context.Context, c conn, what string, err error) error {
	err = s.probed(ctx, c, err)
	return &Error{Op: what + " of " + s.table, Err: err, Hint: s.advice(err, "")}
}

// Stats summarises a [Store]'s table.
type Stats struct {
	// ByStatus counts the records per status; a status without records
	// is absent.
	ByStatus map[Status]int64
	// Total is the number of records.
	Total int64
	// Expired counts the records past their expiry: what Purge would
	// delete now, or strip to the key under a key memory.
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
	if isNil(db) {
		return s.StatsOn(ctx, nil)
	}
	return s.StatsOn(ctx, sqlConn{db})
}

// StatsOn is [Store.Stats] on db, through any driver's adapter (a Runner
// is one: a pool works).
func (s *Store) StatsOn(ctx context.Context, db Conn) (Stats, error) {
	if isNil(db) {
		return Stats{}, errors.New("idem: Stats needs a database handle, got nil")
	}
	c := s.conn(db)
	st := Stats{ByStatus: map[Status]int64{}, TableBytes: -1, IndexBytes: -1}
	err := c.queryRows(ctx, s.st.query(s.st.Stats, &values{retention: micros(s.retention)}), func(scan func(...any) error) error {
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
		return Stats{}, s.inspectError(ctx, c, "stats", err)
	}
	var table, index sql.NullInt64
	if err := c.queryRow(ctx, s.st.query(s.st.Size, &values{}), &table, &index); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Stats{}, s.inspectError(ctx, c, "size", err)
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
