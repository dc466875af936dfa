package idemhttp

import (
	"net/http"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", 255)
	ok := map[string][]string{
		"bare token":           {"abc"},
		"sf-string":            {`"abc"`},
		"uuid string":          {`"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
		"escaped quote":        {`"a\"b"`},
		"escaped backslash":    {`"a\\b"`},
		"surrounding space":    {" \tabc \t"},
		"string then space":    {`"abc"  `},
		"longest key":          {long},
		"longest string":       {`"` + long + `"`},
		"visible ascii edges":  {"!~"},
		"bare with backslash":  {`a\b`},
		"string with = and :":  {`"a=b:c"`},
		"bare token like uuid": {"8e03978e-40d5-43e8-bc93-6894a57f9324"},
	}
	want := map[string]string{
		"bare token": "abc", "sf-string": "abc", "uuid string": "8e03978e-40d5-43e8-bc93-6894a57f9324",
		"escaped quote": `a"b`, "escaped backslash": `a\b`, "surrounding space": "abc", "string then space": "abc",
		"longest key": long, "longest string": long, "visible ascii edges": "!~", "bare with backslash": `a\b`,
		"string with = and :": "a=b:c", "bare token like uuid": "8e03978e-40d5-43e8-bc93-6894a57f9324",
	}
	for name, values := range ok {
		t.Run(name, func(t *testing.T) {
			key, present, p := parseKey(http.Header{"Idempotency-Key": values})
			if p != nil || !present || key != want[name] {
				t.Fatalf("parseKey(%q) = %q, %v, %v; want %q", values, key, present, p, want[name])
			}
		})
	}

	bad := map[string]struct {
		values []string
		detail string // a fragment the detail must hold
	}{
		"two field lines":    {[]string{"a", "b"}, "2 Idempotency-Key field lines"},
		"empty":              {[]string{""}, "is empty"},
		"blank":              {[]string{"  "}, "is empty"},
		"empty string":       {[]string{`""`}, "empty"},
		"list of strings":    {[]string{`"a", "b"`}, "list"},
		"list of tokens":     {[]string{"a,b"}, "a list"},
		"parameters":         {[]string{"a;x=1"}, "parameters"},
		"string parameters":  {[]string{`"a";x=1`}, "follows the closing quote"},
		"unterminated":       {[]string{`"abc`}, "closing double quote is missing"},
		"bad escape":         {[]string{`"a\nb"`}, "backslash"},
		"trailing backslash": {[]string{`"a\`}, "backslash"},
		"space inside":       {[]string{`"a b"`}, "not visible ASCII"},
		"space in token":     {[]string{"a b"}, "not visible ASCII"},
		"stray quote":        {[]string{`a"b`}, "stray double quote"},
		"too long":           {[]string{long + "k"}, "256 bytes"},
		"too long string":    {[]string{`"` + long + `k"`}, "256 bytes"},
		"non-ascii":          {[]string{"caf\xc3\xa9"}, "not visible ASCII"},
		"non-ascii string":   {[]string{"\"caf\xc3\xa9\""}, "printable ASCII"},
		"control in string":  {[]string{"\"a\x01\""}, "printable ASCII"},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			key, present, p := parseKey(http.Header{"Idempotency-Key": c.values})
			if p == nil || !present {
				t.Fatalf("parseKey(%q) = %q, %v, nil; want a 400", c.values, key, present)
			}
			if p.Status != 400 || p.Type != TypeInvalidKey || !strings.Contains(p.Detail, c.detail) {
				t.Fatalf("parseKey(%q): %d %s %q; want 400 %s with %q", c.values, p.Status, p.Type, p.Detail, TypeInvalidKey, c.detail)
			}
		})
	}

	if _, present, p := parseKey(http.Header{}); present || p != nil {
		t.Fatalf("no field: present=%v problem=%v", present, p)
	}
}
