package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// reference is what the record of r keeps as its reference to what the
// handler created: the member of its JSON body that Config.ReferenceField
// names for r, or else its Location header.
func (m *Middleware) reference(r *http.Request, rec *recorder) (string, error) {
	var ptr string
	if m.cfg.ReferenceField != nil {
		ptr = m.cfg.ReferenceField(r)
	}
	if ptr == "" {
		return rec.header.Get("Location"), nil
	}
	ref, err := pointerValue(rec.body.Bytes(), ptr)
	if err != nil {
		return "", fmt.Errorf("idemhttp: the reference of %s %s (Config.ReferenceField %q): %w; nothing was stored", r.Method, r.URL.Path, ptr, err)
	}
	return ref, nil
}

// pointerValue is the value at ptr, a JSON Pointer, in doc, a JSON
// document: a string's text, or a number as written; "" when doc has no
// member there, or null.
func pointerValue(doc []byte, ptr string) (string, error) {
	if !strings.HasPrefix(ptr, "/") {
		return "", fmt.Errorf("%q is not a JSON Pointer: it must start with /", ptr)
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", fmt.Errorf("the response body is not JSON: %w", err)
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch n := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = n[tok]; !ok {
				return "", nil
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n) || tok != strconv.Itoa(i) {
				return "", nil
			}
			v = n[i]
		default:
			return "", nil
		}
	}
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("the member is a %T, not a string or a number", v)
}
