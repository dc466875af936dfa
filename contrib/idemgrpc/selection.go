package idemgrpc

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/idemkit/idem"
)

// selection is what of one method's request messages counts in its
// fingerprint: [Config].FingerprintFields and FingerprintIgnore.
type selection struct {
	fields, ignore []path // sorted by text
	version        string
	// checked holds, per message type, the error of resolving the paths
	// against it (nil: they resolve), so that each type is checked once.
	checked sync.Map // protoreflect.FullName → error
}

// path is a FieldMask path: its text and its field names.
type path struct {
	text  string
	names []protoreflect.Name
}

// newSelection checks the FieldMasks of method: each path is field names
// joined by dots, none named twice, counted within another counted one,
// or ignored while it counts or within what counts. When the method is
// in protobuf's registry (its generated package is linked in), the paths
// are resolved against its request message now; otherwise at its first
// call.
func newSelection(method string, fields, ignore *fieldmaskpb.FieldMask) (*selection, error) {
	s := &selection{}
	var err error
	if s.fields, err = parsePaths(method, "FingerprintFields", fields.GetPaths()); err != nil {
		return nil, err
	}
	if s.ignore, err = parsePaths(method, "FingerprintIgnore", ignore.GetPaths()); err != nil {
		return nil, err
	}
	for _, ig := range s.ignore {
		for _, f := range s.fields {
			if under(f, ig) {
				return nil, fmt.Errorf("idemgrpc: FingerprintIgnore of %s holds %q, which would remove the counted field %q", method, ig.text, f.text)
			}
		}
	}
	for i, a := range s.fields {
		for j, b := range s.fields {
			if i != j && under(b, a) {
				return nil, fmt.Errorf("idemgrpc: FingerprintFields of %s holds %q, which %q counts already", method, b.text, a.text)
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
	s.version = "grpc-" + idem.Fingerprint(parts...)[:16]
	name := protoreflect.FullName(strings.Replace(strings.TrimPrefix(method, "/"), "/", ".", 1))
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(name); err == nil {
		if md, ok := d.(protoreflect.MethodDescriptor); ok {
			if err := s.check(md.Input()); err != nil {
				return nil, fmt.Errorf("idemgrpc: Fingerprint of %s: %w", method, err)
			}
		}
	}
	return s, nil
}

func parsePaths(method, what string, texts []string) ([]path, error) {
	out := make([]path, 0, len(texts))
	for _, t := range texts {
		p := path{text: t}
		for n := range strings.SplitSeq(t, ".") {
			if !protoreflect.Name(n).IsValid() {
				return nil, fmt.Errorf("idemgrpc: %s of %s holds %q, which is not a field path (field names joined by dots, e.g. customer.id)", what, method, t)
			}
			p.names = append(p.names, protoreflect.Name(n))
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b path) int { return strings.Compare(a.text, b.text) })
	for i := 1; i < len(out); i++ {
		if out[i].text == out[i-1].text {
			return nil, fmt.Errorf("idemgrpc: %s of %s names %q twice", what, method, out[i].text)
		}
	}
	return out, nil
}

// under reports whether p is anc or a field within it.
func under(p, anc path) bool {
	return len(p.names) >= len(anc.names) && slices.Equal(p.names[:len(anc.names)], anc.names)
}

// check reports whether every path resolves in md: each of its names
// but the last is a singular message field, as a FieldMask requires.
func (s *selection) check(md protoreflect.MessageDescriptor) error {
	if err, ok := s.checked.Load(md.FullName()); ok {
		e, _ := err.(error)
		return e
	}
	var err error
	for _, p := range slices.Concat(s.fields, s.ignore) {
		if err = resolve(md, p); err != nil {
			break
		}
	}
	s.checked.Store(md.FullName(), err)
	return err
}

func resolve(md protoreflect.MessageDescriptor, p path) error {
	for i, n := range p.names {
		fd := md.Fields().ByName(n)
		if fd == nil {
			return fmt.Errorf("the path %q names %s, which %s has no field of", p.text, n, md.FullName())
		}
		if i == len(p.names)-1 {
			return nil
		}
		if fd.Message() == nil || fd.IsList() || fd.IsMap() {
			return fmt.Errorf("the path %q goes into %s.%s, which is not a singular message field", p.text, md.FullName(), n)
		}
		md = fd.Message()
	}
	return nil
}

// encode returns the canonical form of what of m counts: m less the
// ignored fields (a clear of each, where it is set) when no fields are
// counted; else, for each counted path in increasing byte order, its
// text (length-prefixed), then 0 when the field is not populated (or a
// message on its way is not) or 1 and the field's value as canonical
// writes it.
func (s *selection) encode(m protoreflect.Message) []byte {
	if len(s.ignore) > 0 {
		m = proto.Clone(m.Interface()).ProtoReflect()
		for _, p := range s.ignore {
			clearPath(m, p)
		}
	}
	if len(s.fields) == 0 {
		return canonical(nil, m)
	}
	var b []byte
	for _, p := range s.fields {
		b = protowire.AppendString(b, p.text)
		fd, v, ok := lookup(m, p)
		if !ok {
			b = append(b, 0)
			continue
		}
		b = canonicalField(append(b, 1), fd, v)
	}
	return b
}

// lookup returns the field p names in m and its value, when it and every
// message on its way are populated.
func lookup(m protoreflect.Message, p path) (protoreflect.FieldDescriptor, protoreflect.Value, bool) {
	for i, n := range p.names {
		fd := m.Descriptor().Fields().ByName(n)
		if !m.Has(fd) {
			return nil, protoreflect.Value{}, false
		}
		if i == len(p.names)-1 {
			return fd, m.Get(fd), true
		}
		m = m.Get(fd).Message()
	}
	return nil, protoreflect.Value{}, false
}

// clearPath clears the field p names in m, when it is populated.
func clearPath(m protoreflect.Message, p path) {
	for i, n := range p.names {
		fd := m.Descriptor().Fields().ByName(n)
		if !m.Has(fd) {
			return
		}
		if i == len(p.names)-1 {
			m.Clear(fd)
			return
		}
		m = m.Mutable(fd).Message()
	}
}
