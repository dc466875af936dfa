package idemhttp

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/idemkit/idem"
)

// fingerprint digests what a retry must repeat exactly: the method, the
// path, the query and the body. A JSON body (Content-Type application/json
// or any +json type) that is valid JSON is canonicalised first, so that
// the order of object members and insignificant whitespace do not change
// the digest; any other body is digested byte for byte.
func fingerprint(r *http.Request, body []byte) string {
	kind := "bytes"
	if isJSON(r.Header.Get("Content-Type")) && json.Valid(body) {
		kind, body = "json", canonicalJSON(body)
	}
	return idem.Fingerprint([]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), []byte(kind), body)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// canonicalJSON rewrites a valid JSON text without insignificant
// whitespace and with the members of every object sorted by their key's
// bytes (a stable sort: duplicate keys keep their order). Strings and
// numbers are kept exactly as written, so 1.0 stays 1.0, a big integer
// keeps every digit and "\u0041" stays distinct from "A": two bodies share
// a canonical form only if they differ in whitespace and member order.
func canonicalJSON(b []byte) []byte {
	c := canonicaliser{b: b}
	return c.value(make([]byte, 0, len(b)))
}

// canonicaliser walks a text that json.Valid accepted, so it needs no
// error handling of its own; json.Valid also bounds the nesting depth.
type canonicaliser struct {
	b []byte
	i int
}

type member struct{ key, value []byte }

func (c *canonicaliser) value(out []byte) []byte {
	c.space()
	switch c.b[c.i] {
	case '{':
		c.i++
		var ms []member
		for !c.end('}') {
			c.space()
			key := c.str()
			c.space()
			c.i++ // ':'
			ms = append(ms, member{key: key, value: c.value(nil)})
		}
		slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
		out = append(out, '{')
		for j, m := range ms {
			if j > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, m.key...), ':'), m.value...)
		}
		return append(out, '}')
	case '[':
		c.i++
		out = append(out, '[')
		for first := true; !c.end(']'); first = false {
			if !first {
				out = append(out, ',')
			}
			out = c.value(out)
		}
		return append(out, ']')
	case '"':
		return append(out, c.str()...)
	default: // a number, true, false or null
		start := c.i
		for c.i < len(c.b) && !strings.ContainsRune(" \t\r\n,]}", rune(c.b[c.i])) {
			c.i++
		}
		return append(out, c.b[start:c.i]...)
	}
}

// end consumes a separating comma, or the closing delimiter and reports true.
func (c *canonicaliser) end(closing byte) bool {
	c.space()
	switch c.b[c.i] {
	case closing:
		c.i++
		return true
	case ',':
		c.i++
	}
	return false
}

// str returns a string token, quotes and escapes as written.
func (c *canonicaliser) str() []byte {
	start := c.i
	for c.i++; c.b[c.i] != '"'; c.i++ {
		if c.b[c.i] == '\\' {
			c.i++
		}
	}
	c.i++
	return c.b[start:c.i]
}

func (c *canonicaliser) space() {
	for c.i < len(c.b) && strings.IndexByte(" \t\r\n", c.b[c.i]) >= 0 {
		c.i++
	}
}
