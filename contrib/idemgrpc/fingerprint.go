package idemgrpc

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem"
)

// fingerprintVersion starts every fingerprint, so that the canonical form
// can change without a stored fingerprint matching a request it no longer
// describes.
const fingerprintVersion = "idemgrpc canonical v1"

// fingerprint digests what a retry must repeat exactly: the full method
// name and the request message, in the canonical form below.
func fingerprint(method string, m protoreflect.Message) string {
	return idem.Fingerprint([]byte(fingerprintVersion), []byte(method), canonical(nil, m))
}

// fingerprint is a call's fingerprint: of the whole request, or of what
// the method's selection counts, with its version.
func (i *Interceptor) fingerprint(method string, m protoreflect.Message) (string, error) {
	sel := i.selections[method]
	if sel == nil {
		return fingerprint(method, m), nil
	}
	if err := sel.check(m.Descriptor()); err != nil {
		return "", fmt.Errorf("the Config's FingerprintFields or FingerprintIgnore of %s: %w", method, err)
	}
	return idem.VersionedFingerprint(sel.version, []byte(fingerprintVersion), []byte(method), []byte("selection"), sel.encode(m)), nil
}

// canonical appends the canonical form of m to b. Protobuf's own
// encoding, even proto.MarshalOptions{Deterministic: true}, is stable only
// within one binary (its documentation tells fingerprinting to define its
// own canonical form), so a retry that reached an instance built with
// another protobuf release could be refused as a reused key. This form
// depends only on the message's values and its schema:
//
//   - the populated fields (extensions included) in increasing field
//     number, each as its number (varint) and its value;
//   - a 0 (no field has number 0), then the count of unknown fields
//     (varint) and each of them, stably sorted by field number, as its
//     length (varint) and its bytes as received, tag included;
//   - a repeated field: the count of elements (varint), then each;
//   - a map: the count of entries (varint), then each entry's key and
//     value, entries sorted by the bytes of their key (every key's form
//     below is prefix-free, so this is a total order);
//   - bool: one byte, 0 or 1; every signed integer and enum: 8 bytes,
//     big-endian two's complement; every unsigned integer: 8 bytes,
//     big-endian (so a field widened from int32 to int64 keeps its
//     fingerprint); float: its 4 IEEE 754 bytes; double: its 8; string
//     and bytes: the length (varint) and the bytes; a message or group:
//     the length (varint) and its canonical form.
//
// Values are never coerced: -0.0 and 0.0 differ, as do "1" and "01".
func canonical(b []byte, m protoreflect.Message) []byte {
	type field struct {
		fd protoreflect.FieldDescriptor
		v  protoreflect.Value
	}
	var fields []field
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fields = append(fields, field{fd, v})
		return true
	})
	slices.SortFunc(fields, func(x, y field) int { return cmp.Compare(x.fd.Number(), y.fd.Number()) })
	for _, f := range fields {
		b = protowire.AppendVarint(b, uint64(f.fd.Number()))
		b = canonicalField(b, f.fd, f.v)
	}
	b = protowire.AppendVarint(b, 0)
	return canonicalUnknown(b, m.GetUnknown())
}

// canonicalField appends the value v of a populated field fd: a
// repeated field's count and elements, a map's count and sorted entries,
// or the one value.
func canonicalField(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) []byte {
	switch {
	case fd.IsList():
		l := v.List()
		b = protowire.AppendVarint(b, uint64(l.Len()))
		for i := range l.Len() {
			b = canonicalValue(b, fd, l.Get(i))
		}
		return b
	case fd.IsMap():
		entries := make([][]byte, 0, v.Map().Len())
		v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			e := canonicalValue(nil, fd.MapKey(), k.Value())
			entries = append(entries, canonicalValue(e, fd.MapValue(), v))
			return true
		})
		slices.SortFunc(entries, bytes.Compare)
		b = protowire.AppendVarint(b, uint64(len(entries)))
		for _, e := range entries {
			b = append(b, e...)
		}
		return b
	}
	return canonicalValue(b, fd, v)
}

// canonicalUnknown appends the unknown fields raw, stably sorted by number.
func canonicalUnknown(b []byte, raw protoreflect.RawFields) []byte {
	type field struct {
		num protowire.Number
		raw []byte
	}
	var fields []field
	for len(raw) > 0 {
		num, _, n := protowire.ConsumeField(raw)
		if n < 0 { // not from a successful Unmarshal: keep the rest as it is
			num, n = 0, len(raw)
		}
		fields = append(fields, field{num, raw[:n]})
		raw = raw[n:]
	}
	slices.SortStableFunc(fields, func(x, y field) int { return cmp.Compare(x.num, y.num) })
	b = protowire.AppendVarint(b, uint64(len(fields)))
	for _, f := range fields {
		b = protowire.AppendBytes(b, f.raw)
	}
	return b
}

// canonicalValue appends one value of fd's kind.
func canonicalValue(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) []byte {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if v.Bool() {
			return append(b, 1)
		}
		return append(b, 0)
	case protoreflect.EnumKind:
		return binary.BigEndian.AppendUint64(b, uint64(int64(v.Enum())))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return binary.BigEndian.AppendUint64(b, uint64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return binary.BigEndian.AppendUint64(b, v.Uint())
	case protoreflect.FloatKind:
		return binary.BigEndian.AppendUint32(b, math.Float32bits(float32(v.Float())))
	case protoreflect.DoubleKind:
		return binary.BigEndian.AppendUint64(b, math.Float64bits(v.Float()))
	case protoreflect.StringKind:
		return protowire.AppendString(b, v.String())
	case protoreflect.BytesKind:
		return protowire.AppendBytes(b, v.Bytes())
	}
	return protowire.AppendBytes(b, canonical(nil, v.Message())) // MessageKind, GroupKind
}
