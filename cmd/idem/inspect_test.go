package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// hostile is a record whose stored strings hold terminal control
// sequences, NUL, CR and invalid UTF-8, as a client can make them.
func hostile(body string) *idem.Record {
	now := time.Now()
	return &idem.Record{
		Scope: "tenant\x1b[2J", Key: "k", Operation: "POST /v1/charges\x1b[31m\rFAKE\x00", Fingerprint: "f\x1b]0;title\x07",
		Status: "completed\x1b[0m", Token: 1, CreatedAt: now, LeaseUntil: now, CompletedAt: now, Now: now,
		Response: &idem.Response{StatusCode: 201, Body: []byte(body), Header: map[string][]string{
			"X-Evil\x1b[31m": {"a\x1b[31mred\r\x00b", "\xff\xfe", "\u202etxt.exe"},
			"Content-Type":   {"application/json"},
		}},
	}
}

// safeOutput fails t if out could drive a terminal: a control byte other
// than newline and tab, or invalid UTF-8.
func safeOutput(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s is not valid UTF-8:\n%q", what, out)
	}
	for _, r := range out {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || r == '\u202e' {
			t.Errorf("%s holds %U:\n%q", what, r, out)
			return
		}
	}
}

func TestInspectEscapesStoredStrings(t *testing.T) {
	for _, body := range []string{"ok\r\x1b[31mFAKE", "line 1\nline 2\r\n", "\x00\x1b[31m", "\"quoted\""} {
		var text bytes.Buffer
		printRecord(&text, hostile(body))
		safeOutput(t, "inspect", text.String())
		for _, want := range []string{`"POST /v1/charges\x1b[31m\rFAKE\x00"`, `"X-Evil\x1b[31m": "a\x1b[31mred\r\x00b"`, `"\xff\xfe"`, `"\u202etxt.exe"`, `"f\x1b]0;title\a"`} {
			if !strings.Contains(text.String(), want) {
				t.Errorf("inspect output lacks %s:\n%s", want, text.String())
			}
		}
		var js bytes.Buffer
		if err := writeJSON(&js, inspectJSON(hostile(body))); err != nil {
			t.Fatal(err)
		}
		safeOutput(t, "inspect --json", js.String())
		var back recordJSON
		h := hostile(body)
		if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Operation != h.Operation || back.Status != string(h.Status) ||
			back.Response.Headers["X-Evil\x1b[31m"][2] != h.Response.Header["X-Evil\x1b[31m"][2] {
			t.Errorf("inspect --json does not give back what is stored: %v\n%s", err, js.String())
		}
	}
	var text bytes.Buffer
	printRecord(&text, hostile("ok\r\x1b[31mFAKE"))
	if !strings.Contains(text.String(), "(binary, 12 bytes)") {
		t.Errorf("a body holding ESC is not shown as binary:\n%s", text.String())
	}
	text.Reset()
	printRecord(&text, hostile("line 1\r\nline 2"))
	if !strings.Contains(text.String(), `"line 1\r\nline 2"`) {
		t.Errorf("a text body holding CR is not quoted:\n%s", text.String())
	}
}

// --key takes a key in each form a client sends it in, and stands for the
// key idemhttp stores for that Idempotency-Key field: each field below is
// sent through idemhttp's middleware, and inspect's reading of the same
// text finds the record it stored.
func TestKeyFormsAgreeWithIdemhttp(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "keys.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idem.New(idem.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(idemhttp.Config{Store: s, DB: db, Scope: idemhttp.SingleTenant})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	for _, field := range []string{`"order-1"`, `order-2`, ` "order-3" `, `"a\"b"`, `"a\\b"`, `"it's"`, `x"y`} {
		req := httptest.NewRequest("POST", "/v1/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", field)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 201 && field != `x"y` {
			t.Fatalf("idemhttp refused the field %s: %d %s", field, w.Code, w.Body)
		}
		keys, err := keyForms(field)
		if err != nil {
			t.Errorf("keyForms(%s): %v", field, err)
			continue
		}
		if w.Code != 201 {
			// idemhttp refuses a bare value with a quote; a client that
			// is not HTTP's may use it as a key, and inspect takes it.
			if len(keys) != 1 || keys[0] != field {
				t.Errorf("keyForms(%s) = %q, want the value as it is", field, keys)
			}
			continue
		}
		rec, err := s.Inspect(context.Background(), db, "", keys[0])
		if err != nil || rec == nil {
			t.Errorf("the field %s: idemhttp stored a key that keyForms' first form %q does not find (%v)", field, keys[0], err)
		}
	}
	for _, bad := range []string{`"order 1"`, `order 1`, ``, "\"tab\tin\""} {
		if keys, err := keyForms(bad); err == nil {
			t.Errorf("keyForms(%q) = %q; want an error", bad, keys)
		}
	}
	for _, asIs := range []string{`"unterminated`, `"a\x"`, `"k"tail`} {
		if keys, err := keyForms(asIs); err != nil || len(keys) != 1 || keys[0] != asIs {
			t.Errorf("keyForms(%q), a valid key but no sf-string: %q, %v; want it as it is", asIs, keys, err)
		}
	}
	if keys, err := keyForms(`"k"`); err != nil || len(keys) != 2 || keys[0] != "k" || keys[1] != `"k"` {
		t.Errorf(`keyForms("k") = %q, %v; want k, then "k" as typed`, keys, err)
	}
}
