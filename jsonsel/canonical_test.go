package jsonsel

import (
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCanonical(t *testing.T) {
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
		if got := string(canonical([]byte(in))); got != want {
			t.Errorf("canonical(%s) = %s, want %s", in, got, want)
		}
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
