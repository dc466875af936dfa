package idem

import (
	"encoding/binary"
	"fmt"
)

// sealAD is the additional data of a record's sealed response: its table,
// scope, key and operation, each length-prefixed.
func (s *Store) sealAD(req Request) []byte {
	var b []byte
	for _, p := range []string{s.table, req.Scope, req.Key, req.Operation} {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// sealerKeyID is what is stored beside a record the Store's sealer seals:
// the key it names, or "sealed" for a Sealer that names none.
func (s *Store) sealerKeyID() string {
	if k, ok := s.sealer.(interface{ KeyID() string }); ok {
		return k.KeyID()
	}
	return "sealed"
}

// storedResponse is a response as a record stores it: its status, its encoded
// header and its body, or with a sealer both sealed in one value (the
// header then nil) and the name of the key (keyID; nil in the clear).
type storedResponse struct {
	resp         Response
	header, body []byte
	keyID        any
	ref          any // the reference as result_ref stores it (sealRef); nil for none
}

// seal returns what is stored of resp for req's record.
func (s *Store) seal(req Request, resp Response) (storedResponse, error) {
	ref, err := s.sealRef(req, resp.Reference)
	if err != nil {
		return storedResponse{}, &Error{Op: "seal the response", Scope: req.Scope, Key: req.Key, Err: err, Hint: hintRollBack}
	}
	header := encodeHeader(resp.Header)
	if s.sealer == nil {
		return storedResponse{resp: resp, header: header, body: resp.Body, ref: ref}, nil
	}
	sealed, err := s.sealStored(req, header, resp.Body)
	if err != nil {
		return storedResponse{}, &Error{Op: "seal the response", Scope: req.Scope, Key: req.Key, Err: err, Hint: hintRollBack}
	}
	return storedResponse{resp: resp, body: sealed, keyID: s.sealerKeyID(), ref: ref}, nil
}

// sealStored seals a response of req as stored, its header encoded, with
// the Store's sealer: what response_body holds of a sealed record.
func (s *Store) sealStored(req Request, header, body []byte) ([]byte, error) {
	return s.sealer.Seal(sealedPlaintext(header, body), s.sealAD(req))
}

// sealedPlaintext is what a sealer seals of a response: the encoded
// header, length-prefixed, then the body.
func sealedPlaintext(header, body []byte) []byte {
	plain := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(header)+len(body)), uint64(len(header)))
	return append(append(plain, header...), body...)
}

// open returns the header and body of a record as stored: keyID is the
// name stored beside it ("" in the clear).
func (s *Store) open(req Request, keyID string, header, body []byte) ([]byte, []byte, error) {
	if keyID == "" {
		return header, body, nil
	}
	fail := func(detail string, err error) error {
		return &Error{Op: "open the stored response", Scope: req.Scope, Key: req.Key, Err: err,
			Detail: fmt.Sprintf("the record is sealed with key %q: %s", keyID, detail),
			Hint:   "give the Store a sealer that has the key (WithSealer), or delete the record by hand if its key is lost (docs/operations.md, Sealing)"}
	}
	if s.sealer == nil {
		return nil, nil, fail("the Store has no sealer", &UnsealableError{KeyID: keyID})
	}
	plain, err := s.sealer.Open(body, s.sealAD(req))
	if err != nil {
		return nil, nil, fail(err.Error(), &UnsealableError{KeyID: keyID, Err: err})
	}
	n, k := binary.Uvarint(plain)
	if k <= 0 || uint64(len(plain)-k) < n {
		return nil, nil, fail("what it opens to is not a stored response", &UnsealableError{KeyID: keyID})
	}
	if n == 0 {
		return nil, plain[k:], nil // a nil header, as encodeHeader encodes it
	}
	return plain[k : k+int(n)], plain[k+int(n):], nil
}

// sealRef returns what result_ref stores of ref for req's record: nil
// for none.
func (s *Store) sealRef(req Request, ref string) (any, error) {
	if ref == "" {
		return nil, nil
	}
	if err := checkReference(ref); err != nil {
		return nil, err
	}
	if s.sealer == nil {
		return append([]byte{refClear}, ref...), nil
	}
	sealed, err := s.sealer.Seal([]byte(ref), s.sealAD(req))
	if err != nil {
		return nil, err
	}
	return append([]byte{refSealed}, sealed...), nil
}

// openRef returns the reference stored as b in req's record, opened
// when it is sealed.
func (s *Store) openRef(req Request, b []byte) (string, error) {
	if len(b) == 0 {
		return "", nil
	}
	switch b[0] {
	case refClear:
		return string(b[1:]), nil
	case refSealed:
		id, _, ok := sealedKeyID(b[1:])
		if !ok {
			id = "sealed"
		}
		if s.sealer == nil {
			return "", &UnsealableError{KeyID: id}
		}
		plain, err := s.sealer.Open(b[1:], s.sealAD(req))
		if err != nil {
			return "", &UnsealableError{KeyID: id, Err: err}
		}
		return string(plain), nil
	}
	return "", fmt.Errorf("idem: the stored reference is of an unknown form %d (not written by idem?)", b[0])
}

// The first byte of a stored reference (result_ref): in the clear, or
// sealed by the Store's sealer with the record's additional data, as its
// response is. It says which by itself, since the purge drops sealed_key
// from the tombstone that keeps the reference.
const (
	refClear  = 0
	refSealed = 1
)

// WithSealer seals the body and the stored header of every response the
// Store stores, with s, and opens them for a replay. Records stored
// before (in the clear) still replay; a sealed record that s cannot open
// (a key it does not have, a tampered row) is an error that names the
// record and the key, never a replay and never a run. The fingerprint and
// the operation are compared before anything is opened, so a mismatch
// never decrypts. See docs/operations.md, Sealing.
func WithSealer(s Sealer) Option { return func(st *Store) { st.sealer, st.hasSealer = s, true } }
