package idem

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Limits on the fields of a [Request], checked before any statement runs.
const (
	MaxKeyLen         = 255 // bytes in Request.Key
	MaxScopeLen       = 255 // bytes in Request.Scope
	MaxOperationLen   = 255 // bytes in Request.Operation
	MaxFingerprintLen = 128 // bytes in Request.Fingerprint
)

func (r Request) validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := checkField("Scope", r.Scope, MaxScopeLen); err != nil {
		return err
	}
	if err := checkField("Operation", r.Operation, MaxOperationLen); err != nil {
		return err
	}
	if err := checkField("Fingerprint", r.Fingerprint, MaxFingerprintLen); err != nil {
		return err
	}
	if r.Retention < 0 || r.Retention > MaxDuration {
		return fmt.Errorf("%w: Retention must be 0 (the Store's) or positive and at most %v (MaxDuration), got %v", ErrInvalidRequest, MaxDuration, r.Retention)
	}
	if r.KeyMemory < 0 || r.KeyMemory > MaxDuration {
		return fmt.Errorf("%w: KeyMemory must be 0 (the Store's) or positive and at most %v (MaxDuration), got %v", ErrInvalidRequest, MaxDuration, r.KeyMemory)
	}
	return nil
}

// ValidateKey reports whether key is a valid Idempotency-Key: 1..255 bytes
// of visible ASCII (0x21..0x7E). The error wraps [ErrInvalidKey].
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7E {
			return fmt.Errorf("%w: byte %#02x at offset %d is not visible ASCII (0x21..0x7E)", ErrInvalidKey, c, i)
		}
	}
	return nil
}

func checkField(name, v string, limit int) error {
	switch {
	case len(v) > limit:
		return fmt.Errorf("%w: %s is %d bytes, at most %d allowed", ErrInvalidRequest, name, len(v), limit)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidRequest, name)
	}
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return fmt.Errorf("%w: %s holds a NUL byte at offset %d", ErrInvalidRequest, name, i)
		}
	}
	return nil
}

func (r Response) validate() error {
	if r.StatusCode < 100 || r.StatusCode > 999 {
		return &Error{Op: "store the response", Err: fmt.Errorf("status code %d is not a valid HTTP status (100..999); nothing was stored", r.StatusCode),
			Hint: "return a valid status from fn, and roll back the transaction"}
	}
	return nil
}

// Status is the state of a record.
type Status string

// The statuses of a record.
const (
	// StatusProcessing: a claim holds the key; the operation runs, or its
	// process died (then the claim is taken over once its lease ends).
	StatusProcessing Status = "processing"
	// StatusCompleted: the operation's response is stored and replays.
	StatusCompleted Status = "completed"
	// StatusReleased: the claim was given up without a result; the next
	// attempt takes the key over at once.
	StatusReleased Status = "released"
	// StatusExpired: the operation's response is gone, its retention over,
	// but the key is kept to its forget time, by the key memory of the
	// request or the Store that completed it ([Request.KeyMemory],
	// [WithKeyMemory]): a
	// request with it is refused ([ErrExpired], or [ErrMismatch]).
	StatusExpired Status = "expired"
)

// MaxDuration is the largest lease, retention or Extend that idem accepts:
// 100 years. Durations are sent to the database in microseconds and added
// to its clock; a larger one could overflow that arithmetic (Go's
// time.Duration near its maximum) or a DATETIME column (year 9999 on
// MySQL), and would then mean a lease or retention already over.
const MaxDuration = 100 * 365 * 24 * time.Hour
