package idemhttp

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/sfv"
)

// The header fields of the protocol.
const (
	// HeaderIdempotencyKey is the request header field that carries the
	// key.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is set to "true" on every replayed response.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
	// HeaderAttempt numbers a request its client sends again: 2 on the
	// first retry, 3 on the next (idemclient's Transport sends it). A
	// request with a number above 1 is most likely served already,
	// perhaps by another instance: the middleware reads its key's record
	// before it claims the key ([idem.WithRetryHint]). It is a hint: a
	// wrong number costs one read and changes no answer.
	HeaderAttempt = "Idempotency-Attempt"
)

// isRetry reports whether h numbers its request as a retry
// (HeaderAttempt above 1).
func isRetry(h http.Header) bool {
	v := strings.TrimSpace(h.Get(HeaderAttempt))
	if v == "" {
		return false
	}
	n, err := strconv.Atoi(v)
	return err == nil && n > 1
}

// parseKey reads the Idempotency-Key field of h. The value is an RFC 8941
// sf-string ("abc", with the escapes \" and \\), as
// draft-ietf-httpapi-idempotency-key-header defines it, or a bare token
// (abc) as many clients send it. present is false when there is no such
// field; a malformed one is a 400 Problem.
func parseKey(h http.Header) (key string, present bool, p *Problem) {
	lines := h.Values(HeaderIdempotencyKey)
	switch len(lines) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, invalidKey("the request has %d %s field lines; send exactly one", len(lines), HeaderIdempotencyKey)
	}
	v := strings.Trim(lines[0], " \t")
	if v == "" {
		return "", true, invalidKey("the %s field is empty; send a unique key such as a UUID, e.g. %s: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"", HeaderIdempotencyKey, HeaderIdempotencyKey)
	}
	if v[0] == '"' {
		key, err := sfv.String(v)
		if err != "" {
			return "", true, invalidKey("%s value %s is not a valid structured-field string: %s", HeaderIdempotencyKey, sfv.Quote(v), err)
		}
		return checkKey(key)
	}
	if i := strings.IndexAny(v, ",;\""); i >= 0 {
		what := map[byte]string{',': "a list (a comma)", ';': "parameters (a semicolon)", '"': "a stray double quote"}[v[i]]
		return "", true, invalidKey("%s value %s holds %s at offset %d; send exactly one key, as a string (\"abc\") or a bare token (abc)", HeaderIdempotencyKey, sfv.Quote(v), what, i)
	}
	return checkKey(v)
}

func checkKey(key string) (string, bool, *Problem) {
	if err := idem.ValidateKey(key); err != nil {
		return "", true, invalidKey("%v; a key is 1 to %d bytes of visible ASCII (0x21..0x7E), e.g. a UUID", err, idem.MaxKeyLen)
	}
	return key, true, nil
}

func invalidKey(detail string, args ...any) *Problem {
	return problem(http.StatusBadRequest, TypeInvalidKey, "Invalid Idempotency-Key", detail, args...)
}
