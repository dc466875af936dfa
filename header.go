package idem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
)

// headerFormat is the first byte of an encoded header, so that the
// encoding can change without misreading old rows.
const headerFormat = 1

// encodeHeader encodes h byte for byte: names in sorted order, each with its
// values in order, every string length-prefixed. A nil header encodes as nil.
func encodeHeader(h http.Header) []byte {
	if h == nil {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 1 + binary.MaxVarintLen64
	for name, vs := range h {
		names = append(names, name)
		size += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range vs {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerFormat)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		vs := h[name]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errCorruptHeader = errors.New("stored response header is corrupt")

// decodeHeader is the inverse of encodeHeader.
func decodeHeader(b []byte) (http.Header, error) {
	if b == nil {
		return nil, nil
	}
	if len(b) == 0 || b[0] != headerFormat {
		return nil, errCorruptHeader
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	h := make(http.Header, min(n, uint64(len(d.b))))
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := d.string()
		count := d.uvarint()
		vs := make([]string, 0, min(count, uint64(len(d.b))))
		for j := uint64(0); j < count && d.err == nil; j++ {
			vs = append(vs, d.string())
		}
		h[name] = vs
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errCorruptHeader
	}
	return h, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorruptHeader
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errCorruptHeader
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
