package idemhttp

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestFingerprint(t *testing.T) {
	fp := func(method, target, contentType, body string) string {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		fp, p := fingerprinter{}.of(r, []byte(body))
		if p != nil {
			t.Fatal(p)
		}
		return fp
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
		fp, p := fingerprinter{}.of(r, []byte(body))
		if p != nil {
			t.Fatal(p)
		}
		return fp
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

func TestFingerprintSelection(t *testing.T) {
	f, err := newFingerprinter(Config{FingerprintFields: []string{"/amount", "/currency"}, FingerprintHeaders: []string{"x-tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	fp := func(contentType, body, tenant string) (string, *Problem) {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		if tenant != "" {
			r.Header.Set("X-Tenant", tenant)
		}
		return f.of(r, []byte(body))
	}
	base, p := fp("application/json", `{"amount":100,"currency":"eur","sent_at":"12:00"}`, "t1")
	if p != nil || !strings.HasPrefix(base, f.version+":") {
		t.Fatalf("fingerprint %q, %v; want one of version %s", base, p, f.version)
	}
	if got, _ := fp("application/json", `{"sent_at":"12:01","currency":"eur","amount":100,"retry":2}`, "t1"); got != base {
		t.Error("an uncounted field changed the fingerprint")
	}
	for name, body := range map[string]string{"amount": `{"amount":101,"currency":"eur"}`, "absent": `{"currency":"eur"}`, "null": `{"amount":null,"currency":"eur"}`} {
		if got, _ := fp("application/json", body, "t1"); got == base {
			t.Errorf("%s: a counted field's change kept the fingerprint", name)
		}
	}
	if got, _ := fp("application/json", `{"amount":100,"currency":"eur"}`, "t2"); got == base {
		t.Error("a counted header's change kept the fingerprint")
	}
	if got, _ := fp("application/json", `{"amount":100,"currency":"eur"}`, ""); got == base {
		t.Error("an absent counted header kept the fingerprint")
	}
	if _, p := fp("text/plain", `{"amount":100}`, "t1"); p == nil || p.Status != 415 || p.Type != TypeBodyNotJSON {
		t.Errorf("a body that is not JSON: %v, want a 415 of type %s", p, TypeBodyNotJSON)
	}
	for _, body := range []string{`{"amount":100`, ``, `{"amount":1,"AMOUNT":2}`} {
		if _, p := fp("application/json", body, "t1"); p == nil || p.Status != 400 || p.Type != TypeBodyInvalidJSON {
			t.Errorf("body %q: %v, want a 400 of type %s", body, p, TypeBodyInvalidJSON)
		}
	}
	other, err := newFingerprinter(Config{FingerprintFields: []string{"/amount"}, FingerprintHeaders: []string{"X-Tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	if other.version == f.version {
		t.Error("another selection has the same version")
	}
	for _, cfg := range []Config{{FingerprintFields: []string{"amount"}}, {FingerprintIgnore: []string{""}},
		{FingerprintHeaders: []string{"Idempotency-Key"}}, {FingerprintHeaders: []string{"a b"}}, {FingerprintHeaders: []string{"x-a", "X-A"}}} {
		if _, err := newFingerprinter(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// FingerprintHeaders alone counts the whole body and the headers, under
// a version of its own.
func TestFingerprintHeadersOnly(t *testing.T) {
	f, err := newFingerprinter(Config{FingerprintHeaders: []string{"X-Tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	fp := func(body, tenant string) string {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant", tenant)
		got, p := f.of(r, []byte(body))
		if p != nil {
			t.Fatal(p)
		}
		return got
	}
	base := fp(`{"a":1,"b":2}`, "t1")
	if !strings.HasPrefix(base, f.version+":") || f.version == "" {
		t.Fatalf("fingerprint %q is not of the version %q", base, f.version)
	}
	if fp(`{ "b":2, "a":1 }`, "t1") != base {
		t.Error("member order changed the fingerprint")
	}
	if fp(`{"a":1,"b":3}`, "t1") == base || fp(`{"a":1,"b":2}`, "t2") == base {
		t.Error("the body or the header changed and the fingerprint did not")
	}
}
