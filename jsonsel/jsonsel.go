package jsonsel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
)

// ErrNotJSON reports a document that is not valid JSON.
var ErrNotJSON = errors.New("jsonsel: the document is not valid JSON")

// ErrAmbiguous reports a document in which a step of a counted pointer
// matches two members (the same name twice, or in two cases): a decoder
// keeps one of them, of its own choice, so what counts is not known.
var ErrAmbiguous = errors.New("jsonsel: a counted member appears twice")

// Canonical returns the canonical form of doc (see the package
// documentation), or an error wrapping [ErrNotJSON].
func Canonical(doc []byte) ([]byte, error) {
	if !json.Valid(doc) {
		return nil, ErrNotJSON
	}
	return canonical(doc), nil
}

// Selection chooses what of a document counts. Its zero value, and a
// nil one, count the whole document.
type Selection struct {
	fields, ignore []pointer
	version        string
}

// pointer is a parsed JSON Pointer.
type pointer struct {
	text  string   // as written
	steps []string // unescaped reference tokens
}

// New returns the Selection of fields (the JSON Pointers that count) and
// ignore (those that do not), or an error naming a pointer that is not
// one (RFC 6901: "" or "/"-separated tokens, with "~0" for '~' and "~1"
// for '/'), is named twice, is counted within another counted one, or
// is ignored while it counts or within what counts ("/order" counted and
// "/order/trace_id" ignored is fine; the other way round is not).
func New(fields, ignore []string) (*Selection, error) {
	s := &Selection{}
	var err error
	if s.fields, err = parseAll("Fields", fields); err != nil {
		return nil, err
	}
	if s.ignore, err = parseAll("Ignore", ignore); err != nil {
		return nil, err
	}
	for _, p := range s.ignore {
		if p.text == "" {
			return nil, errors.New(`jsonsel: Ignore holds "", the whole document`)
		}
		for _, f := range s.fields {
			if within(f, p) {
				return nil, fmt.Errorf("jsonsel: Ignore holds %q, which would remove the counted field %q", p.text, f.text)
			}
		}
	}
	for i, a := range s.fields {
		for j, b := range s.fields {
			if i != j && within(b, a) {
				return nil, fmt.Errorf("jsonsel: Fields holds %q, which %q counts already", b.text, a.text)
			}
		}
	}
	parts := [][]byte{[]byte("fields")}
	for _, p := range s.fields {
		parts = append(parts, []byte(p.text))
	}
	parts = append(parts, []byte("ignore"))
	for _, p := range s.ignore {
		parts = append(parts, []byte(p.text))
	}
	s.version = "json-" + idem.Fingerprint(parts...)[:16]
	return s, nil
}

// parseAll parses the pointers of a list named what, sorted by their
// text, and refuses one named twice.
func parseAll(what string, texts []string) ([]pointer, error) {
	out := make([]pointer, 0, len(texts))
	for _, t := range texts {
		p, err := parse(t)
		if err != nil {
			return nil, fmt.Errorf("jsonsel: %s: %w", what, err)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b pointer) int { return strings.Compare(a.text, b.text) })
	for i := 1; i < len(out); i++ {
		if out[i].text == out[i-1].text {
			return nil, fmt.Errorf("jsonsel: %s names %q twice", what, out[i].text)
		}
	}
	return out, nil
}

func parse(text string) (pointer, error) {
	p := pointer{text: text}
	if text == "" {
		return p, nil
	}
	if text[0] != '/' {
		return p, fmt.Errorf("%q is not a JSON Pointer: it must be empty or begin with '/'", text)
	}
	for _, tok := range strings.Split(text[1:], "/") {
		for i := 0; i < len(tok); i++ {
			if tok[i] == '~' && (i+1 == len(tok) || tok[i+1] != '0' && tok[i+1] != '1') {
				return p, fmt.Errorf("%q is not a JSON Pointer: '~' must be followed by 0 or 1", text)
			}
		}
		p.steps = append(p.steps, strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~"))
	}
	return p, nil
}

// within reports whether p is anc or lies under it. Steps compare as
// member names do, case-folded.
func within(p, anc pointer) bool {
	if len(p.steps) < len(anc.steps) {
		return false
	}
	for i, s := range anc.steps {
		if !bytes.Equal(foldStep(s), foldStep(p.steps[i])) {
			return false
		}
	}
	return true
}

// foldStep is a pointer's step folded as a member name is (foldedName).
func foldStep(step string) []byte {
	token, _ := json.Marshal(step) // a string always marshals
	return foldedName(nil, token)
}

// Version names the selection: "json-" and the first 16 hexadecimal
// digits of idem.Fingerprint of "fields", the counted pointers in
// increasing byte order, "ignore" and the ignored ones in that order. Two Selections of the same pointers, in any
// order, have the same Version; any other change changes it. A nil or
// zero Selection's is "json-all".
func (s *Selection) Version() string {
	if s == nil || s.version == "" {
		return "json-all"
	}
	return s.version
}

// Select returns the canonical form of what of doc counts (see the
// package documentation), or an error wrapping [ErrNotJSON] or
// [ErrAmbiguous].
func (s *Selection) Select(doc []byte) ([]byte, error) {
	if !json.Valid(doc) {
		return nil, ErrNotJSON
	}
	if s == nil || len(s.fields) == 0 && len(s.ignore) == 0 {
		return canonical(doc), nil
	}
	p := parser{canonicaliser{b: doc}}
	root := p.value()
	for _, ig := range s.ignore {
		root.remove(ig.steps)
	}
	if len(s.fields) == 0 {
		return root.write(nil), nil
	}
	out := []byte{'{'}
	first := true
	for _, f := range s.fields {
		n, err := root.find(f)
		if err != nil {
			return nil, err
		}
		if n == nil {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		name, _ := json.Marshal(f.text) // a string always marshals
		out = n.write(append(append(out, name...), ':'))
	}
	return append(out, '}'), nil
}

// node is a parsed JSON value: an object (members), an array (elems) or
// a scalar as written (raw); or an array's element that an ignored
// pointer removed, which keeps its place, so that the indexes of the
// others do not change, and is written as nothing.
type node struct {
	kind    byte // '{', '[', removed, or 0 for a scalar
	raw     []byte
	members []objMember
	elems   []*node
}

// removed is the kind of an ignored array element.
const removed = 'x'

type objMember struct {
	key, name []byte // the name token as written, and folded
	val       *node
}

// find returns the node p points at, nil when it points at nothing, or
// an error when a step matches two members.
func (n *node) find(p pointer) (*node, error) {
	for _, step := range p.steps {
		switch n.kind {
		case '{':
			want := foldStep(step)
			var found *node
			for _, m := range n.members {
				if bytes.Equal(m.name, want) {
					if found != nil {
						return nil, fmt.Errorf("%w: the counted field %q names a member that appears twice (in the same or another case)", ErrAmbiguous, p.text)
					}
					found = m.val
				}
			}
			if found == nil {
				return nil, nil
			}
			n = found
		case '[':
			i, ok := index(step)
			if !ok || i >= len(n.elems) {
				return nil, nil
			}
			n = n.elems[i]
		default:
			return nil, nil
		}
	}
	if n.kind == removed {
		return nil, nil
	}
	return n, nil
}

// remove removes what steps point at: every member a step matches.
func (n *node) remove(steps []string) {
	if len(steps) == 0 {
		return
	}
	switch n.kind {
	case '{':
		want := foldStep(steps[0])
		kept := n.members[:0]
		for _, m := range n.members {
			if bytes.Equal(m.name, want) {
				if len(steps) == 1 {
					continue
				}
				m.val.remove(steps[1:])
			}
			kept = append(kept, m)
		}
		n.members = kept
	case '[':
		i, ok := index(steps[0])
		if !ok || i >= len(n.elems) {
			return
		}
		if len(steps) == 1 {
			n.elems[i] = &node{kind: removed}
			return
		}
		n.elems[i].remove(steps[1:])
	}
}

// index parses an array step: a decimal index without leading zeros.
func index(step string) (int, bool) {
	if step == "" || len(step) > 1 && step[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(step); i++ {
		if step[i] < '0' || step[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(step)
	return i, err == nil
}

// write appends n's canonical form to out, as canonical writes it.
func (n *node) write(out []byte) []byte {
	switch n.kind {
	case '{':
		ms := slices.Clone(n.members)
		slices.SortStableFunc(ms, func(a, b objMember) int { return bytes.Compare(a.name, b.name) })
		out = append(out, '{')
		for j, m := range ms {
			if j > 0 {
				out = append(out, ',')
			}
			out = m.val.write(append(append(out, m.key...), ':'))
		}
		return append(out, '}')
	case '[':
		out = append(out, '[')
		for j, e := range n.elems {
			if j > 0 {
				out = append(out, ',')
			}
			out = e.write(out)
		}
		return append(out, ']')
	}
	return append(out, n.raw...) // a scalar; nothing for a removed element
}

// parser builds the nodes of a text json.Valid accepted, with the
// canonicaliser's scanning.
type parser struct{ canonicaliser }

func (p *parser) value() *node {
	p.space()
	switch p.b[p.i] {
	case '{':
		p.i++
		n := &node{kind: '{'}
		for !p.end('}') {
			p.space()
			key := p.str()
			p.space()
			p.i++ // ':'
			n.members = append(n.members, objMember{key: key, name: p.fold(key), val: p.value()})
		}
		return n
	case '[':
		p.i++
		n := &node{kind: '['}
		for !p.end(']') {
			n.elems = append(n.elems, p.value())
		}
		return n
	}
	return &node{raw: p.scalar()}
}
