package idem

import (
	"fmt"
	"strings"
)

// MaxFingerprintVersionLen is the longest version [VersionedFingerprint]
// takes, so that a versioned fingerprint fits [MaxFingerprintLen].
const MaxFingerprintVersionLen = MaxFingerprintLen - 65

// VersionedFingerprint is [Fingerprint] of the parts, prefixed by version
// and a colon: "version:hex". The version names how the parts were
// chosen from the request (which fields count, which are ignored), so
// that a request fingerprinted after that choice changed is told apart
// from a request whose payload changed: a key whose record holds a
// fingerprint of another version is [ErrFingerprintChanged], not a plain
// [ErrMismatch]. The version is 1..[MaxFingerprintVersionLen] bytes of
// letters, digits, '-', '_' and '.'; VersionedFingerprint panics on any
// other, which is a bug of its caller, never of a request.
func VersionedFingerprint(version string, parts ...[]byte) string {
	if err := CheckFingerprintVersion(version); err != nil {
		panic(err)
	}
	return version + ":" + Fingerprint(parts...)
}

// CheckFingerprintVersion reports whether version is one that
// [VersionedFingerprint] takes.
func CheckFingerprintVersion(version string) error {
	if version == "" || len(version) > MaxFingerprintVersionLen {
		return fmt.Errorf("idem: a fingerprint version is 1..%d bytes, got %d", MaxFingerprintVersionLen, len(version))
	}
	for i := 0; i < len(version); i++ {
		c := version[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("idem: fingerprint version %q holds %q: only letters, digits, '-', '_' and '.'", version, c)
		}
	}
	return nil
}

// FingerprintVersion returns the version of a fingerprint: the text
// before its last colon, or "" when it has none (a fingerprint of
// [Fingerprint], or any of the caller's own without a colon). Two
// fingerprints of one key whose versions differ were chosen from their
// requests in two ways, and Do reports them as [ErrFingerprintChanged].
func FingerprintVersion(fingerprint string) string {
	i := strings.LastIndexByte(fingerprint, ':')
	if i < 0 {
		return ""
	}
	return fingerprint[:i]
}
