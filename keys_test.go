package idem_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// ParseKeys reads the keys file that the CLI reads too: ID and key, hex or
// base64, comments and blank lines skipped, the last key current.
func TestParseKeys(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	file := "# the application's keys\n\nk2025 " + hex.EncodeToString(k1) + "\n  k2026\t" + base64.StdEncoding.EncodeToString(k2) + "  \n"
	current, keys, err := idem.ParseKeys(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if current != "k2026" || len(keys) != 2 || !bytes.Equal(keys["k2025"], k1) || !bytes.Equal(keys["k2026"], k2) {
		t.Fatalf("ParseKeys = %q, %v", current, keys)
	}
	if _, err := idem.NewAESGCMSealer(current, keys); err != nil {
		t.Fatal(err)
	}
}

// Each error names its line and never the key's material.
func TestParseKeysErrors(t *testing.T) {
	good := hex.EncodeToString(bytes.Repeat([]byte{7}, 32))
	short := base64.StdEncoding.EncodeToString([]byte("sixteen-byte-key"))
	shortHex := hex.EncodeToString([]byte("sixteen-byte-key"))
	for name, c := range map[string]struct {
		file string
		want []string
	}{
		"one field":       {"# c\nk1\n", []string{"line 2:", "a key ID and a key"}},
		"three fields":    {"k1 " + good + " extra\n", []string{"line 1:", "got 3 fields"}},
		"not hex nor b64": {"k0 " + good + "\nk1 !!!notakey!!!\n", []string{"line 2:", `"k1"`, "neither hex nor base64"}},
		"short base64":    {"\n\nk1 " + short + "\n", []string{"line 3:", `"k1"`, "16 bytes", "32"}},
		"short hex":       {"k1 " + shortHex + "\n", []string{"line 1:", `"k1"`, "16 bytes", "32"}},
		"duplicate":       {"k1 " + good + "\n# again\nk1 " + good + "\n", []string{"line 3:", `"k1"`, "given twice", "line 1"}},
		"bad ID":          {"k\x01 " + good + "\n", []string{"line 1:", "key ID", "not visible ASCII"}},
		"long ID":         {strings.Repeat("i", idem.MaxKeyIDLen+1) + " " + good + "\n", []string{"line 1:", "key ID", "1 to 64 bytes"}},
		"no key":          {"# nothing\n\n", []string{"no key"}},
	} {
		_, _, err := idem.ParseKeys(strings.NewReader(c.file))
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", name, err, w)
			}
		}
		for _, secret := range []string{good, short, shortHex, "notakey"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: %v shows key material", name, err)
			}
		}
	}
}
