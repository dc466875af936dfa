package jsonsel

import (
	"errors"
	"testing"
)

func TestSelect(t *testing.T) {
	cases := []struct {
		fields, ignore []string
		doc, want      string
	}{
		{nil, nil, `{"b":1, "a":2}`, `{"a":2,"b":1}`},
		{[]string{"/amount", "/currency"}, nil, `{"currency":"eur","trace":"t1","amount":100}`, `{"/amount":100,"/currency":"eur"}`},
		{[]string{"/currency", "/amount"}, nil, ` { "amount" : 100 , "currency":"eur"}`, `{"/amount":100,"/currency":"eur"}`},
		{[]string{"/amount"}, nil, `{"trace":"t2"}`, `{}`},
		{[]string{"/amount"}, nil, `{"amount":null}`, `{"/amount":null}`},
		{[]string{"/amount"}, nil, `{"AMOUNT":5}`, `{"/amount":5}`},
		{[]string{"/order"}, []string{"/order/trace"}, `{"order":{"trace":"x","id":7,"TRACE":"y"},"other":1}`, `{"/order":{"id":7}}`},
		{nil, []string{"/trace", "/meta/sent_at"}, `{"trace":"x","amount":1,"meta":{"sent_at":"now","tenant":"t"}}`, `{"amount":1,"meta":{"tenant":"t"}}`},
		{nil, []string{"/items/0", "/items/1/note"}, `{"items":[{"a":1},{"note":"n","b":2},3]}`, `{"items":[,{"b":2},3]}`},
		{[]string{"/items/1"}, []string{"/items/0"}, `{"items":[1,2]}`, `{"/items/1":2}`},
		{[]string{"/items/0"}, nil, `{"items":[]}`, `{}`},
		{[]string{"/items/-", "/items/01", "/items/x"}, nil, `{"items":[1,2]}`, `{}`},
		{[]string{"/a~1b", "/c~0d"}, nil, `{"a/b":1,"c~d":2,"a":{"b":3}}`, `{"/a~1b":1,"/c~0d":2}`},
		{[]string{"/s/x"}, nil, `{"s":"text"}`, `{}`},
		{[]string{""}, nil, `{"b":1,"a":[2.0]}`, `{"":{"a":[2.0],"b":1}}`},
		{[]string{"/n"}, nil, `{"n":1.0}`, `{"/n":1.0}`},
	}
	for _, c := range cases {
		s, err := New(c.fields, c.ignore)
		if err != nil {
			t.Fatalf("New(%q, %q): %v", c.fields, c.ignore, err)
		}
		got, err := s.Select([]byte(c.doc))
		if err != nil || string(got) != c.want {
			t.Errorf("Select(%q, %q) of %s = %s, %v; want %s", c.fields, c.ignore, c.doc, got, err, c.want)
		}
	}
}

// Without pointers, and for the members left, the selection writes the
// canonical form Canonical writes.
func TestSelectAgreesWithCanonical(t *testing.T) {
	s, err := New(nil, []string{"/absent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{`{"b":1,"\u0061":2,"a":3}`, `{"a":3,"b":1,"\u0061":2}`, `[{"\u212a":1,"k":2,"j":3}, " x ", -0, 1e2]`,
		`{"k\"}":1,"k":2}`, `"\u0041 \" \\ }"`, "{ \"a\" :\n[ 1 , 2.0 ,\t{\"z\":null,\"y\":true} ] } "} {
		want, err := Canonical([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Select([]byte(doc))
		if err != nil || string(got) != string(want) {
			t.Errorf("Select of %s = %s, %v; Canonical = %s", doc, got, err, want)
		}
	}
}

func TestSelectRefuses(t *testing.T) {
	s, err := New([]string{"/amount"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{`{"amount":1,"amount":2}`, `{"amount":1,"Amount":2}`, `{"amount":1,"\u0061mount":2}`} {
		if _, err := s.Select([]byte(doc)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("Select of %s: %v, want ErrAmbiguous", doc, err)
		}
	}
	for _, doc := range []string{``, `amount=1`, `{"amount":1`, `{"amount":01}`} {
		if _, err := s.Select([]byte(doc)); !errors.Is(err, ErrNotJSON) {
			t.Errorf("Select of %q: %v, want ErrNotJSON", doc, err)
		}
	}
	if _, err := Canonical([]byte(`{`)); !errors.Is(err, ErrNotJSON) {
		t.Errorf("Canonical of {: %v, want ErrNotJSON", err)
	}
	// An ignored member that appears twice is removed twice: no error.
	ig, err := New(nil, []string{"/trace"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ig.Select([]byte(`{"trace":1,"TRACE":2,"a":1}`)); err != nil || string(got) != `{"a":1}` {
		t.Errorf("an ignored member twice: %s, %v", got, err)
	}
}

func TestNewRefuses(t *testing.T) {
	cases := []struct{ fields, ignore []string }{
		{[]string{"amount"}, nil},
		{[]string{"/a~2"}, nil},
		{[]string{"/a~"}, nil},
		{[]string{"/a", "/a"}, nil},
		{[]string{"/a", "/a/b"}, nil},
		{[]string{"/a", "/A/b"}, nil},
		{nil, []string{""}},
		{[]string{"/a/b"}, []string{"/a"}},
		{[]string{"/a"}, []string{"/a"}},
		{nil, []string{"x"}},
	}
	for _, c := range cases {
		if _, err := New(c.fields, c.ignore); err == nil {
			t.Errorf("New(%q, %q) accepted", c.fields, c.ignore)
		}
	}
}

// A Version is a function of the pointers alone, fixed across releases:
// a stored fingerprint's version must still match after an upgrade.
func TestVersion(t *testing.T) {
	a, _ := New([]string{"/amount", "/currency"}, []string{"/meta/trace"})
	b, _ := New([]string{"/currency", "/amount"}, []string{"/meta/trace"})
	c, _ := New([]string{"/amount"}, []string{"/meta/trace"})
	d, _ := New([]string{"/amount", "/currency"}, nil)
	e, _ := New(nil, []string{"/amount", "/currency"})
	if a.Version() != b.Version() {
		t.Error("the order of the pointers changed the version")
	}
	seen := map[string]bool{}
	for _, s := range []*Selection{a, c, d, e, nil} {
		if seen[s.Version()] {
			t.Errorf("two selections share the version %s", s.Version())
		}
		seen[s.Version()] = true
	}
	if got, want := a.Version(), "json-5eff6a1a2a58969c"; got != want {
		t.Errorf("Version = %s, want %s: a version must never change between releases", got, want)
	}
}
