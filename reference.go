package idem

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxReference is the most bytes a [Response.Reference] may hold.
const MaxReference = 2048

// ErrInvalidReference reports a [Response.Reference] over [MaxReference]
// bytes, not valid UTF-8, or holding a control character; the message
// says which. Nothing is stored: roll back.
var ErrInvalidReference = errors.New("idem: invalid response reference")

// ExpiredError is the error of a key refused with [ErrExpired]: it
// carries the reference the first request recorded to what it created
// ([Response.Reference]), which the record keeps past its response, so
// that the client can fetch the object instead. errors.Is(err,
// [ErrExpired]) reports true for it; errors.As finds it through idem's
// [*Error].
type ExpiredError struct {
	// Reference is the first request's [Response.Reference]; "" when it
	// recorded none, or when it could not be opened (ReferenceErr).
	Reference string
	// ReferenceErr is why a sealed reference could not be opened (the
	// Store has no sealer, or not its key); nil otherwise. The key is
	// refused all the same.
	ReferenceErr error
}

func (e *ExpiredError) Error() string {
	if e.Reference == "" {
		return ErrExpired.Error()
	}
	return fmt.Sprintf("%v; it created %s", ErrExpired, e.Reference)
}

// Is makes errors.Is(err, [ErrExpired]) true.
func (e *ExpiredError) Is(target error) bool { return target == ErrExpired }

// The first byte of a stored reference (result_ref): in the clear, or
// sealed by the Store's sealer with the record's additional data, as its
// response is. It says which by itself, since the purge drops sealed_key
// from the tombstone that keeps the reference.
const (
	refClear  = 0
	refSealed = 1
)

// checkReference reports a reference that a record cannot keep.
func checkReference(ref string) error {
	switch {
	case len(ref) > MaxReference:
		return fmt.Errorf("%w: Reference is %d bytes, more than %d (MaxReference); store a shorter one (an ID, a path)", ErrInvalidReference, len(ref), MaxReference)
	case !utf8.ValidString(ref):
		return fmt.Errorf("%w: Reference is not valid UTF-8", ErrInvalidReference)
	}
	for i := 0; i < len(ref); i++ {
		if ref[i] < 0x20 || ref[i] == 0x7F {
			return fmt.Errorf("%w: Reference holds the control character %#02x at byte %d", ErrInvalidReference, ref[i], i)
		}
	}
	return nil
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

// expired reports that req's key has a record whose response is gone,
// kept by the key memory, with the reference it kept (rec's).
func (s *Store) expired(req Request, rec record) error {
	ee := &ExpiredError{}
	ee.Reference, ee.ReferenceErr = s.openRef(req, rec.ref)
	hint := "do not retry with this key: look the outcome up another way, or send a new request with a new key"
	if ee.Reference != "" {
		hint = "do not retry with this key: fetch what it created (" + ee.Reference + "), or send a new request with a new key"
	}
	return &Error{Op: "claim", Scope: req.Scope, Key: req.Key, Err: ee,
		Detail: "the key was used and its response is gone: its retention has passed, and the Store keeps the key for its key memory; nothing ran",
		Hint:   hint}
}
