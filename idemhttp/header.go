package idemhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idem"
)

// The header fields of the protocol.
const (
	// HeaderIdempotencyKey is the request header field that carries the
	// key.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is set to "true" on every replayed response.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

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
		key, err := parseString(v)
		if err != "" {
			return "", true, invalidKey("%s value %s is not a valid structured-field string: %s", HeaderIdempotencyKey, quote(v), err)
		}
		return checkKey(key)
	}
	if i := strings.IndexAny(v, ",;\""); i >= 0 {
		what := map[byte]string{',': "a list (a comma)", ';': "parameters (a semicolon)", '"': "a stray double quote"}[v[i]]
		return "", true, invalidKey("%s value %s holds %s at offset %d; send exactly one key, as a string (\"abc\") or a bare token (abc)", HeaderIdempotencyKey, quote(v), what, i)
	}
	return checkKey(v)
}

// parseString parses an sf-string that must make up the whole of v, and
// returns its content or why it is not one.
func parseString(v string) (string, string) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || v[i] != '"' && v[i] != '\\' {
				return "", fmt.Sprintf("a backslash at offset %d must be followed by \" or \\", i-1)
			}
			b.WriteByte(v[i])
		case c == '"':
			if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" {
				if rest[0] == ',' {
					return "", "it is a list; send exactly one key"
				}
				return "", fmt.Sprintf("%s follows the closing quote; send exactly one key and nothing after it", quote(rest))
			}
			return b.String(), ""
		case c < 0x20 || c > 0x7E:
			return "", fmt.Sprintf("byte %#02x at offset %d is not allowed in a string (printable ASCII only)", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "the closing double quote is missing"
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

// quote quotes a client's value for a detail message, shortened so that
// a huge header does not make a huge answer.
func quote(v string) string {
	const limit = 100
	if len(v) > limit {
		return fmt.Sprintf("%q... (%d bytes)", v[:limit], len(v))
	}
	return fmt.Sprintf("%q", v)
}
