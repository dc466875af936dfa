package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
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
