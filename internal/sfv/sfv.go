// Package sfv reads the structured field value (RFC 8941) that an
// Idempotency-Key header holds, in one place for every reader of it:
// idemhttp's middleware, and the idem command, which accepts a key as a
// client sent it.
package sfv

import (
	"fmt"
	"strings"
)

// String parses an sf-string (RFC 8941, section 3.3.3) that must make up
// the whole of v, from its opening double quote to its closing one and
// optional trailing white space, and returns its content, or why v is
// not one.
func String(v string) (content, why string) {
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
				return "", fmt.Sprintf("%s follows the closing quote; send exactly one key and nothing after it", Quote(rest))
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

// Quote quotes a client's value for a message, shortened so that
// a huge header does not make a huge answer.
func Quote(v string) string {
	const limit = 100
	if len(v) > limit {
		return fmt.Sprintf("%q... (%d bytes)", v[:limit], len(v))
	}
	return fmt.Sprintf("%q", v)
}
