package idem

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Sealer seals what idem stores of a response (its body and stored
// header) and opens it for a replay. The additional data binds a
// ciphertext to its record (table, scope, key, operation), so that a row
// copied onto another key fails to open. [NewAESGCMSealer] is the
// standard one: keys by ID, the current one seals, every one opens. A
// Sealer that names the key it seals with (a method KeyID() string, as
// NewAESGCMSealer's has) has that name stored beside each record, for
// `idem inspect` and for ResealOn, which rewrites the records sealed with
// other keys.
type Sealer interface {
	Seal(plaintext, additional []byte) ([]byte, error)
	Open(ciphertext, additional []byte) ([]byte, error)
}

// MaxKeyIDLen is the longest key ID [NewAESGCMSealer] takes: the schema
// stores it beside each record.
const MaxKeyIDLen = 64

// NewAESGCMSealer returns a [Sealer] that seals with AES-256-GCM under
// the key named current and opens with any of keys, each of which must
// be 32 bytes; key IDs are 1 to 64 bytes of visible ASCII. To rotate,
// add a new key and make it current: records sealed with the old ones
// still open, and ResealOn (`idem reseal`) rewrites them under the new
// one; drop an old key only once none is sealed with it.
//
// Each seal draws a random 24-byte salt and derives a key of its own from
// the key named and the salt (HMAC-SHA256), so that no GCM nonce repeats
// under one key however many records are sealed. A ciphertext is a
// version byte, the key ID, the salt, and the GCM ciphertext with its
// tag: 42 bytes and the key ID's length more than the plaintext.
func NewAESGCMSealer(current string, keys map[string][]byte) (Sealer, error) {
	if _, ok := keys[current]; !ok {
		return nil, fmt.Errorf("idem: NewAESGCMSealer: the current key %q is not among the keys (%s)", current, keyNames(keys))
	}
	s := &aesGCMSealer{current: current, keys: make(map[string][]byte, len(keys))}
	for id, k := range keys {
		if err := checkKeyID(id); err != nil {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: %w", err)
		}
		if len(k) != 32 {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: key %q is %d bytes; AES-256 takes 32", id, len(k))
		}
		s.keys[id] = append([]byte(nil), k...)
	}
	return s, nil
}

// ParseKeys reads a keys file: the keys of [NewAESGCMSealer], in the one
// format the library and the idem command (--keys-file) share. Each line
// is a key ID, then spaces or tabs, then the 32-byte key, as 64 hex
// digits or in standard padded base64 (44 characters); blank lines and
// lines whose first character that is not a space is # are skipped. A
// key ID is 1 to 64 bytes of visible ASCII, given once. current is the
// ID of the file's last key, the one a sealer made of it seals with:
// append a new key to rotate.
//
//	current, keys, err := idem.ParseKeys(f)
//	...
//	sealer, err := idem.NewAESGCMSealer(current, keys)
//
// An error names the line it is about (a line that is not an ID and a
// key, a key that is neither hex nor base64 or not 32 bytes, an invalid
// or repeated ID), by its number from 1, and never shows a key.
func ParseKeys(r io.Reader) (current string, keys map[string][]byte, err error) {
	keys = map[string][]byte{}
	lines := map[string]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fail := func(format string, args ...any) (string, map[string][]byte, error) {
			return "", nil, fmt.Errorf("idem: keys file: line %d: %s", n, fmt.Sprintf(format, args...))
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return fail("want a key ID and a key, separated by spaces; got %d fields", len(fields))
		}
		id, enc := fields[0], fields[1]
		if err := checkKeyID(id); err != nil {
			return fail("%v", err)
		}
		if first, dup := lines[id]; dup {
			return fail("key ID %q given twice (first on line %d)", id, first)
		}
		key, err := decodeKey(enc)
		if err != nil {
			return fail("the key of %q %v", id, err)
		}
		keys[id], lines[id], current = key, n, id
	}
	if err := sc.Err(); err != nil {
		return "", nil, fmt.Errorf("idem: keys file: %w", err)
	}
	if len(keys) == 0 {
		return "", nil, errors.New("idem: keys file: no key in it")
	}
	return current, keys, nil
}

// decodeKey reads a key of a keys file: 32 bytes, as hex or base64. Its
// error says what is wrong without showing the key.
func decodeKey(enc string) ([]byte, error) {
	hexKey, hexErr := hex.DecodeString(enc)
	if hexErr == nil && len(hexKey) == 32 {
		return hexKey, nil
	}
	b64Key, b64Err := base64.StdEncoding.DecodeString(enc)
	switch {
	case b64Err == nil && len(b64Key) == 32:
		return b64Key, nil
	case hexErr == nil:
		return nil, fmt.Errorf("is %d bytes as hex; AES-256 takes 32 (64 hex digits, or 44 characters of base64)", len(hexKey))
	case b64Err == nil:
		return nil, fmt.Errorf("is %d bytes as base64; AES-256 takes 32 (44 characters of base64, or 64 hex digits)", len(b64Key))
	}
	return nil, errors.New("is neither hex nor base64 (standard, padded)")
}

// keyNames lists the IDs of keys, sorted, for a message.
func keyNames(keys map[string][]byte) string {
	ids := make([]string, 0, len(keys))
	for id := range keys {
		ids = append(ids, fmt.Sprintf("%q", id))
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

func checkKeyID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return fmt.Errorf("key ID %q must be 1 to %d bytes", id, MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7E {
			return fmt.Errorf("key ID %q: byte %#02x is not visible ASCII", id, c)
		}
	}
	return nil
}

// aesGCMSealer is NewAESGCMSealer's Sealer.
type aesGCMSealer struct {
	current string
	keys    map[string][]byte
}

// ErrUnsealable reports a stored response that cannot be opened: sealed
// with a key the Store's sealer lacks (or by a Store with a sealer, read
// by one without), or sealed and then changed. Nothing ran, and nothing
// will for its key, until the key is deployed (or the row is put right):
// a retry cannot succeed before, and is not worth making automatically.
// errors.As finds the [*UnsealableError], which names the key.
// idemserve answers it with an outcome of its own (Unsealable), idemhttp
// with 501.
var ErrUnsealable = errors.New("idem: the stored response cannot be opened")

// UnsealableError is the error of a stored response that cannot be
// opened ([ErrUnsealable]), in the Err of the [*Error] that names the
// record. errors.Is(err, ErrUnsealable) is true for it.
type UnsealableError struct {
	// KeyID names the key the record is sealed with.
	KeyID string
	// Err is why it does not open: the sealer's error; nil when the
	// Store has no sealer, or what opened is not a stored response.
	Err error
}

func (e *UnsealableError) Error() string {
	msg := fmt.Sprintf("%v: it is sealed with key %q", ErrUnsealable, e.KeyID)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, [ErrUnsealable]) true.
func (e *UnsealableError) Is(target error) bool { return target == ErrUnsealable }

// Unwrap returns Err.
func (e *UnsealableError) Unwrap() error { return e.Err }

// KeyID names the key the sealer seals with.
func (s *aesGCMSealer) KeyID() string { return s.current }

func (s *aesGCMSealer) Seal(plaintext, additional []byte) ([]byte, error) {
	head := make([]byte, 0, 2+len(s.current)+sealSalt)
	head = append(head, sealVersion, byte(len(s.current)))
	head = append(head, s.current...)
	salt := make([]byte, sealSalt)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	head = append(head, salt...)
	aead, err := derived(s.keys[s.current], salt)
	if err != nil {
		return nil, err
	}
	return aead.Seal(head, salt[:aead.NonceSize()], plaintext, append(head[:len(head):len(head)], additional...)), nil
}

func (s *aesGCMSealer) Open(ciphertext, additional []byte) ([]byte, error) {
	id, rest, ok := sealedKeyID(ciphertext)
	if !ok || len(rest) < sealSalt {
		return nil, errors.New("not a value NewAESGCMSealer sealed (its header is malformed)")
	}
	key, ok := s.keys[id]
	if !ok {
		return nil, fmt.Errorf("sealed with key %q, which the sealer does not have (it has %s)", id, keyNames(s.keys))
	}
	salt := rest[:sealSalt]
	aead, err := derived(key, salt)
	if err != nil {
		return nil, err
	}
	head := ciphertext[:len(ciphertext)-len(rest)+sealSalt]
	plain, err := aead.Open(nil, salt[:aead.NonceSize()], rest[sealSalt:], append(head[:len(head):len(head)], additional...))
	if err != nil {
		return nil, fmt.Errorf("sealed with key %q, but it does not open: the row was changed, or copied from another record", id)
	}
	return plain, nil
}

// sealedKeyID reads the key ID of a value NewAESGCMSealer sealed, and
// what follows it.
func sealedKeyID(b []byte) (id string, rest []byte, ok bool) {
	if len(b) < 2 || b[0] != sealVersion || len(b) < 2+int(b[1]) {
		return "", nil, false
	}
	return string(b[2 : 2+b[1]]), b[2+b[1]:], true
}

// derived is AES-256-GCM under the key derived from key and salt.
func derived(key, salt []byte) (cipher.AEAD, error) {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("idem seal v1"))
	mac.Write(salt)
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// The layout of a sealed value.
const (
	sealVersion = 1
	sealSalt    = 24
)
