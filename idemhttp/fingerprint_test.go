package idemhttp

import (
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCanonicalJSON(t *testing.T) {
	cases := map[string]string{
		`{"b":1,"a":2}`: `{"a":2,"b":1}`,
		" { \"a\" :\n[ 1 , 2.0 ,\t{\"z\":null,\"y\":true} ] } ": `{"a":[1,2.0,{"y":true,"z":null}]}`,
		`1.0`:                            `1.0`,
		`123456789012345678901234567890`: `123456789012345678901234567890`,
		`-0`:                             `-0`,
		`1e2`:                            `1e2`,
		`{"a":1,"a":2}`:                  `{"a":1,"a":2}`,
		`{"a":2,"a":1}`:                  `{"a":2,"a":1}`,
		`{"b":1,"\u0061":2,"a":3}`:       `{"\u0061":2,"a":3,"b":1}`,
		`{"a":3,"b":1,"\u0061":2}`:       `{"a":3,"\u0061":2,"b":1}`,
		`{"b":1,"A":2,"a":3}`:            `{"A":2,"a":3,"b":1}`,
		`{"\u212a":1,"k":2,"j":3}`:       `{"j":3,"\u212a":1,"k":2}`,
		`{"b":{"d":[],"c":{}},"a":""}`:   `{"a":"","b":{"c":{},"d":[]}}`,
		`"\u0041 \" \\ }"`:               `"\u0041 \" \\ }"`,
		`{"k\"}":1,"k":2}`:               `{"k":2,"k\"}":1}`,
		`[]`:                             `[]`,
		`{}`:                             `{}`,
	}
	for in, want := range cases {
		if got := string(canonicalJSON([]byte(in))); got != want {
			t.Errorf("canonicalJSON(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	fp := func(method, target, contentType, body string) string {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		return fingerprint(r, []byte(body))
	}
	base := fp("POST", "/v1/charges", "application/json", `{"amount":100,"currency":"eur"}`)
	same := map[string]string{
		"member order":  fp("POST", "/v1/charges", "application/json", `{"currency":"eur","amount":100}`),
		"whitespace":    fp("POST", "/v1/charges", "application/json", "{ \"amount\": 100,\n \"currency\": \"eur\" }\n"),
		"charset param": fp("POST", "/v1/charges", "application/json; charset=utf-8", `{"currency":"eur","amount":100}`),
		"+json type":    fp("POST", "/v1/charges", "application/merge-patch+json", `{"amount":100,"currency":"eur"}`),
		"leading space": fp("POST", "/v1/charges", "application/vnd.api+json", ` {"amount":100,"currency":"eur"}`),
	}
	for name, got := range same {
		if got != base {
			t.Errorf("%s changed the fingerprint", name)
		}
	}
	differ := map[string]string{
		"1.0 vs 1":          fp("POST", "/v1/charges", "application/json", `{"amount":100.0,"currency":"eur"}`),
		"big integer digit": fp("POST", "/v1/charges", "application/json", `{"amount":100000000000000000001,"currency":"eur"}`),
		"value":             fp("POST", "/v1/charges", "application/json", `{"amount":101,"currency":"eur"}`),
		"method":            fp("PATCH", "/v1/charges", "application/json", `{"amount":100,"currency":"eur"}`),
		"path":              fp("POST", "/v1/refunds", "application/json", `{"amount":100,"currency":"eur"}`),
		"query":             fp("POST", "/v1/charges?capture=false", "application/json", `{"amount":100,"currency":"eur"}`),
		"not json":          fp("POST", "/v1/charges", "text/plain", `{"amount":100,"currency":"eur"}`),
		"invalid json":      fp("POST", "/v1/charges", "application/json", `{"amount":100,"currency":"eur"`),
	}
	for name, got := range differ {
		if got == base {
			t.Errorf("%s did not change the fingerprint", name)
		}
	}
	if fp("POST", "/x", "text/plain", "a b") == fp("POST", "/x", "text/plain", "a  b") {
		t.Error("a non-JSON body is not digested byte for byte")
	}
	big1 := fp("POST", "/x", "application/json", `[100000000000000000001]`)
	big2 := fp("POST", "/x", "application/json", `[100000000000000000002]`)
	if big1 == big2 {
		t.Error("big integers that differ in the last digit share a fingerprint")
	}
	if len(base) != 64 {
		t.Errorf("fingerprint %q is not a hex SHA-256", base)
	}
}

// Members whose names a decoder merges (the same name unescaped, or the
// same name but for case, which encoding/json matches to one struct field)
// are kept in the order written: encoding/json keeps the last of them, so
// swapping them changes the request and must change the fingerprint.
func TestFingerprintDuplicateNames(t *testing.T) {
	fp := func(body string) string {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		return fingerprint(r, []byte(body))
	}
	pairs := [][2]string{
		{`{"amount":1,"\u0061mount":1000}`, `{"\u0061mount":1000,"amount":1}`},
		{`{"amount":1,"amount":1000}`, `{"amount":1000,"amount":1}`},
		{`{"amount":1,"AMOUNT":1000}`, `{"AMOUNT":1000,"amount":1}`},
		{`{"currency":"eur","amount":1,"\u0061mount":1000}`, `{"\u0061mount":1000,"currency":"eur","amount":1}`},
		{`{"x":{"amount":1,"am\u006fun\u0074":1000}}`, `{"x":{"am\u006fun\u0074":1000,"amount":1}}`},
	}
	for _, p := range pairs {
		if fp(p[0]) == fp(p[1]) {
			t.Errorf("%s and %s share a fingerprint", p[0], p[1])
		}
	}
	if fp(`{"amount":1,"\u0061mount":1000,"currency":"eur"}`) != fp(`{"currency":"eur","amount":1,"\u0061mount":1000}`) {
		t.Error("moving a member with another name changed the fingerprint")
	}
}

// The fold of a plain ASCII name, done without decoding it, is the fold
// of the decoded name for every byte a name can hold unescaped.
func TestFoldedNameASCII(t *testing.T) {
	for b := byte(0x20); b < 0x7F; b++ {
		if b == '"' || b == '\\' {
			continue
		}
		token := []byte{'"', b, '"'}
		want := []byte{}
		for _, r := range string(b) {
			least := r
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				least = min(least, f)
			}
			want = utf8.AppendRune(want, least)
		}
		if got := foldedName(nil, token); string(got) != string(want) {
			t.Errorf("foldedName(%s) = %q, want %q", token, got, want)
		}
	}
}
