package idem

import (
	"database/sql"
	"fmt"
	"time"
)

// keyRecord is a row of the table as acquire reads it.
type keyRecord struct {
	operation   string
	fingerprint string
	status      Status
	token       int64
	forgotten   bool          // past its expiry (and key memory): counts as absent
	expired     bool          // its response is gone (past its expiry, or kept by the key memory)
	leaseLeft   time.Duration // by the database clock; <= 0 once expired
	code        sql.NullInt64 // the response's status code
	header      []byte        // the stored header (NULL when sealed)
	body        []byte        // the stored body, or header and body sealed
	sealedKey   sql.NullString
	ref         []byte // the stored reference (result_ref), as sealRef made it
	// until is how long the replay cache may hold the record, as read by
	// readCompleted; zero for any other read.
	until time.Time
}

// matches reports whether rec was made by a request like req: the same
// operation and fingerprint.
func (rec keyRecord) matches(req Request) bool {
	return rec.operation == req.Operation && rec.fingerprint == req.Fingerprint
}

// into is where a row of read goes: into rec, and the lease left, in µs,
// into leaseLeft.
func (rec *keyRecord) into(leaseLeft *int64) []any {
	return []any{&rec.operation, &rec.fingerprint, &rec.status, &rec.token, &rec.forgotten, &rec.expired, leaseLeft,
		&rec.code, &rec.header, &rec.body, &rec.sealedKey, &rec.ref}
}

// mismatchError reports that req's key has a record of another request.
func mismatchError(req Request, rec keyRecord) error {
	what := "payload (Fingerprint)"
	if rec.operation != req.Operation {
		what = fmt.Sprintf("operation %q", rec.operation)
	}
	if rec.operation == req.Operation && FingerprintVersion(rec.fingerprint) != FingerprintVersion(req.Fingerprint) {
		return &Error{Op: "claim", Scope: req.Scope, Key: req.Key, Err: ErrFingerprintChanged,
			Detail: fmt.Sprintf("the key's record was fingerprinted with version %q, this request with %q: which fields of a request count changed since the key was first used; nothing ran",
				FingerprintVersion(rec.fingerprint), FingerprintVersion(req.Fingerprint)),
			Hint: "the record's response stays stored until its retention passes; look the outcome up another way, or send a new request with a new key"}
	}
	return &Error{Op: "claim", Scope: req.Scope, Key: req.Key, Err: ErrMismatch,
		Detail: "idempotency key reused with a different request: the key was first used with another " + what,
		Hint:   "use a new key for a new request"}
}

// response is the stored response of rec, opened when it is sealed.
func (s *Store) response(req Request, rec keyRecord) (Response, error) {
	header, body, err := s.open(req, rec.sealedKey.String, rec.header, rec.body)
	if err != nil {
		return Response{}, err
	}
	h, err := decodeHeader(header)
	if err != nil {
		return Response{}, &Error{Op: "read the record", Scope: req.Scope, Key: req.Key, Err: err,
			Detail: "its stored response header is corrupt (not written by idem?)",
			Hint:   "delete the record by hand (docs/operations.md) or wait for it to pass retention"}
	}
	ref, err := s.openRef(req, rec.ref)
	if err != nil {
		return Response{}, &Error{Op: "open the stored reference", Scope: req.Scope, Key: req.Key, Err: err,
			Hint: "give the Store a sealer that has the key (WithSealer), or delete the record by hand if its key is lost (docs/operations.md, Sealing)"}
	}
	return Response{StatusCode: int(rec.code.Int64), Header: h, Body: body, Reference: ref}, nil
}
