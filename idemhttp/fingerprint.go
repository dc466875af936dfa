package idemhttp

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/jsonsel"
)

// fingerprinter digests what a retry must repeat exactly: the method, the
// path, the query and the body, or of the body what [Config]'s
// FingerprintFields and FingerprintIgnore select, and the header fields
// of FingerprintHeaders.
type fingerprinter struct {
	sel     *jsonsel.Selection // nil: the whole body
	headers []string           // canonical names, sorted
	version string             // "": the unversioned fingerprint of the whole request
}

// newFingerprinter checks cfg's selection. Without one the fingerprint
// is the unversioned one every release before selections made, so that
// the keys stored by them keep replaying.
func newFingerprinter(cfg Config) (fingerprinter, error) {
	var f fingerprinter
	if len(cfg.FingerprintFields) > 0 || len(cfg.FingerprintIgnore) > 0 {
		sel, err := jsonsel.New(cfg.FingerprintFields, cfg.FingerprintIgnore)
		if err != nil {
			return f, fmt.Errorf("idemhttp: FingerprintFields or FingerprintIgnore: %w", err)
		}
		f.sel = sel
	}
	for _, name := range cfg.FingerprintHeaders {
		c := textproto.CanonicalMIMEHeaderKey(name)
		if c == "" || strings.ContainsAny(c, " \t\r\n:") {
			return f, fmt.Errorf("idemhttp: FingerprintHeaders holds %q, which is not a header field name", name)
		}
		if c == HeaderIdempotencyKey {
			return f, fmt.Errorf("idemhttp: FingerprintHeaders holds %s, which is the key itself", name)
		}
		if slices.Contains(f.headers, c) {
			return f, fmt.Errorf("idemhttp: FingerprintHeaders names %s twice", c)
		}
		f.headers = append(f.headers, c)
	}
	slices.Sort(f.headers)
	if f.sel == nil && len(f.headers) == 0 {
		return f, nil
	}
	parts := [][]byte{[]byte("body"), []byte(f.sel.Version()), []byte("headers")}
	for _, h := range f.headers {
		parts = append(parts, []byte(h))
	}
	f.version = "http-" + idem.Fingerprint(parts...)[:16]
	return f, nil
}

// of returns r's fingerprint, or the Problem that refuses a body the
// selection cannot read.
//
// Without a selection, a JSON body (Content-Type application/json or any
// +json type) that is valid JSON is canonicalised first (package
// jsonsel), so that the order of object members and insignificant
// whitespace do not change the digest; any other body is digested byte
// for byte. With one, the body must be JSON, and what counts of it is
// jsonsel's selection.
func (f fingerprinter) of(r *http.Request, body []byte) (string, *Problem) {
	kind := "bytes"
	switch {
	case f.sel != nil:
		if !isJSON(r.Header.Get("Content-Type")) {
			return "", problem(http.StatusUnsupportedMediaType, TypeBodyNotJSON, "JSON body required",
				"%s %s compares selected fields of a JSON body to recognise a retry, so its body must be JSON (Content-Type application/json or a +json type), got Content-Type %q; nothing ran",
				r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		sel, err := f.sel.Select(body)
		if err != nil {
			detail := "the body is not valid JSON"
			if errors.Is(err, jsonsel.ErrAmbiguous) {
				detail = err.Error()
			}
			return "", problem(http.StatusBadRequest, TypeBodyInvalidJSON, "Invalid JSON body",
				"%s %s compares selected fields of the JSON body to recognise a retry, and cannot: %s; nothing ran; send a valid body", r.Method, r.URL.Path, detail)
		}
		kind, body = "json-selection", sel
	case isJSON(r.Header.Get("Content-Type")) && len(body) > 0:
		if c, err := jsonsel.Canonical(body); err == nil {
			kind, body = "json", c
		}
	}
	parts := [][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), []byte(kind), body}
	if f.version == "" {
		return idem.Fingerprint(parts...), nil
	}
	for _, h := range f.headers {
		values := r.Header.Values(h)
		parts = append(parts, []byte(h), []byte(strconv.Itoa(len(values))))
		for _, v := range values {
			parts = append(parts, []byte(v))
		}
	}
	return idem.VersionedFingerprint(f.version, parts...), nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
