package jsonsel

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// canonical rewrites a valid JSON text without insignificant
// whitespace and with the members of every object sorted by name. Strings
// and numbers are kept exactly as written, so 1.0 stays 1.0, a big integer
// keeps every digit and "\u0041" stays distinct from "A": two bodies share
// a canonical form only if they differ in whitespace and in an order of
// members that no decoder reads differently.
//
// Members are sorted by their name as a decoder sees it: unescaped (as
// encoding/json does: "\u0061mount" is "amount") and case-folded (as
// encoding/json matches struct fields: "AMOUNT" fills Amount). Members
// whose names are the same in that sense keep the order they were written
// in, because that order decides what the handler gets: encoding/json keeps
// the last of them, other decoders the first. So {"amount":1,"amount":1000}
// and {"amount":1000,"amount":1} get two fingerprints, and a retry that
// swaps them is refused as a reused key (422) instead of replaying a
// charge of the other amount; the same bytes again still replay.
func canonical(b []byte) []byte {
	c := canonicaliser{b: b}
	return c.value(make([]byte, 0, len(b)))
}

// canonicaliser walks a text that json.Valid accepted, so it needs no
// error handling of its own; json.Valid also bounds the nesting depth.
type canonicaliser struct {
	b     []byte
	i     int
	names []byte // the folded names of the members, one after another
}

type member struct{ key, name, value []byte }

func (c *canonicaliser) value(out []byte) []byte {
	c.space()
	switch c.b[c.i] {
	case '{':
		c.i++
		var few [8]member
		ms := few[:0]
		for !c.end('}') {
			c.space()
			key := c.str()
			c.space()
			c.i++ // ':'
			ms = append(ms, member{key: key, name: c.fold(key), value: c.member()})
		}
		slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.name, b.name) })
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
	default:
		return append(out, c.scalar()...)
	}
}

// member returns the canonical form of the value of an object's member:
// a string, number, true, false or null as written, without a copy.
func (c *canonicaliser) member() []byte {
	c.space()
	if b := c.b[c.i]; b == '{' || b == '[' {
		return c.value(nil)
	}
	return c.scalar()
}

// scalar returns a string, number, true, false or null token as written.
func (c *canonicaliser) scalar() []byte {
	if c.b[c.i] == '"' {
		return c.str()
	}
	start := c.i
	for c.i < len(c.b) && !strings.ContainsRune(" \t\r\n,]}", rune(c.b[c.i])) {
		c.i++
	}
	return c.b[start:c.i]
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

// fold returns the folded name (foldedName) of a member name token,
// written after the others in c.names. Earlier names stay valid when
// c.names grows: they keep the array they were written in.
func (c *canonicaliser) fold(token []byte) []byte {
	start := len(c.names)
	c.names = foldedName(c.names, token)
	return c.names[start:]
}

// foldedName appends to out a member name token as a decoder compares it:
// unescaped the way encoding/json unescapes it (invalid UTF-8 and lone
// surrogates become U+FFFD) and every rune replaced by the smallest rune
// of its simple case folding orbit, so two names are equal under
// strings.EqualFold exactly when their folded names are equal. A name of
// ASCII without escapes, the usual one, folds without decoding: the
// smallest rune of an ASCII letter's orbit is its upper case (K and S
// included: their other runes, U+212A and U+017F, are larger).
func foldedName(out, token []byte) []byte {
	name := token[1 : len(token)-1]
	if plainASCII(name) {
		for _, b := range name {
			if 'a' <= b && b <= 'z' {
				b -= 'a' - 'A'
			}
			out = append(out, b)
		}
		return out
	}
	// The token is from a text json.Valid accepted, so this cannot fail;
	// if it did, the name would be "" and its member keep its place.
	var s string
	_ = json.Unmarshal(token, &s)
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		out = utf8.AppendRune(out, least)
	}
	return out
}

// plainASCII reports whether name has only ASCII bytes and no escape.
func plainASCII(name []byte) bool {
	for _, b := range name {
		if b >= utf8.RuneSelf || b == '\\' {
			return false
		}
	}
	return true
}
