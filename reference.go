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
