package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

// runIn runs the command in this process and returns its exit code and
// everything it wrote.
func runIn(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// closedPort is a loopback port nothing listens on: a connection to it is
// refused at once.
func closedPort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// The two DSNs of issue 10: an upper-case scheme that pgx read as
// key=value settings and quoted whole in its error, and a key=value DSN cut
// at the ':' after its password and quoted as an unknown scheme.
func TestDSNReportedLeaks(t *testing.T) {
	port := closedPort(t)
	for name, dsn := range map[string]string{
		"upper-case scheme": fmt.Sprintf("POSTGRES://alice:s3cretpw@127.0.0.1:%d/test?sslmode=disable", port),
		"key=value":         "password=s3cretpw host=::1",
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runIn("stats", "--dsn", dsn)
			if code != 2 || !strings.HasPrefix(stderr, "idem: ") {
				t.Errorf("exit %d, stderr %q; want exit 2 and one idem: line", code, stderr)
			}
			if strings.Contains(stdout+stderr, "s3cretpw") {
				t.Errorf("the output shows the password:\nstdout %q\nstderr %q", stdout, stderr)
			}
		})
	}
}

// A DSN given without --dsn is a stray argument, refused without quoting it.
func TestDSNWithoutFlag(t *testing.T) {
	code, stdout, stderr := runIn("stats", "mysql://alice:s3cretpw@127.0.0.1:1/test")
	if code != 2 || !strings.Contains(stderr, "--dsn") || strings.Contains(stdout+stderr, "s3cretpw") {
		t.Errorf("exit %d, stderr %q; want exit 2, a hint at --dsn and no password", code, stderr)
	}
}

// A password whose reserved characters are not percent-encoded must not
// become a host, a port or a database name, quoted in an error or looked
// up in DNS.
func TestDSNRawReservedPassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://alice:1234/5678@127.0.0.1:1/db",
		"postgres://alice:ab?cdef@127.0.0.1:1/db",
		"mysql://alice:ab#cdef@127.0.0.1:1/db",
	} {
		code, stdout, stderr := runIn("stats", "--dsn", dsn)
		if code != 2 || !strings.Contains(stderr, "percent-encode") {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and advice to percent-encode", dsn, code, stderr)
		}
		for _, piece := range []string{"1234", "5678", "cdef", "alice"} {
			if strings.Contains(stdout+stderr, piece) {
				t.Errorf("%s: the output shows %q: %q", dsn, piece, stderr)
			}
		}
	}
}

// A driver's error that quotes the DSN or its password is scrubbed.
func TestRedactorScrubs(t *testing.T) {
	dsn := "postgres://alice:p%40ss%20w0rd@127.0.0.1:1/db?sslpassword=k3y-s3cret&sslmode=disable"
	r := &redactor{}
	r.add(dsnSecrets(dsn)...)
	for _, msg := range []string{
		"cannot parse `" + dsn + "`",
		"auth failed for password p@ss w0rd",
		`auth failed for password "p@ss w0rd"`,
		"auth failed for password p%40ss%20w0rd",
		"auth failed for password p%40ss+w0rd",
		"bad sslpassword k3y-s3cret",
	} {
		got := r.scrub(msg)
		for _, secret := range []string{"p@ss", "ss w0rd", "p%40ss", "k3y-s3cret", "alice:"} {
			if strings.Contains(got, secret) {
				t.Errorf("scrub(%q) = %q: shows %q", msg, got, secret)
			}
		}
	}
	kv := "host=::1 user=alice password='it\\'s a s3cret' sslpassword=k3y\\ x dbname=test"
	r = &redactor{}
	r.add(dsnSecrets(kv)...)
	if got := r.scrub("saw " + kv); strings.Contains(got, "s3cret") || strings.Contains(got, "k3y") {
		t.Errorf("a key=value DSN is not scrubbed: %q", got)
	}
}

// dsnForms write a DSN with a password in each shape the command may be
// given, well-formed or not; host, user and database are fixed and local.
var dsnForms = []func(pw, dir string, port int) string{
	func(pw, _ string, port int) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/test?sslmode=disable", url.UserPassword("alice", pw), port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("postgresql://%s@[::1]:%d/test", url.UserPassword("alice", pw), port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("mysql://%s@127.0.0.1:%d/test", url.UserPassword("alice", pw), port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("mysql://%s@[::1]:%d/test?timeout=1s", url.UserPassword("alice", pw), port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("postgres://alice:%s@127.0.0.1:%d/test?sslmode=disable", pw, port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("mysql://alice:%s@localhost:%d/test", pw, port)
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("postgres://127.0.0.1:%d/test?user=alice&password=%s&sslmode=disable", port, url.QueryEscape(pw))
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("postgres://alice@localhost:%d/test?sslpassword=%s", port, url.QueryEscape(pw))
	},
	func(pw, _ string, port int) string {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=alice password=%s dbname=test", port, pw)
	},
	func(pw, _ string, port int) string {
		q := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
		return fmt.Sprintf("host=::1 port=%d user=alice password='%s' dbname=test", port, q)
	},
	func(pw, _ string, _ int) string { return "password=" + pw + " host=::1" },
	func(pw, _ string, port int) string { return fmt.Sprintf("alice:%s@tcp(127.0.0.1:%d)/test", pw, port) },
	func(pw, dir string, _ int) string {
		return "sqlite:" + filepath.Join(dir, "absent.db") + "?password=" + url.QueryEscape(pw)
	},
	func(pw, dir string, _ int) string {
		return "file:" + filepath.Join(dir, "absent.db") + "?_auth_pass=" + pw
	},
}

// withCase upper-cases the first letters of dsn (its scheme, or its first
// key) where mask has a bit set.
func withCase(dsn string, mask uint8) string {
	b := []byte(dsn)
	for i := 0; i < len(b) && i < 8; i++ {
		if mask&(1<<i) != 0 && b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// stand is a password of the same shape as pw, every letter, digit and
// non-ASCII character changed and the rest kept: the command treats it
// as it treats pw, so what both outputs show is the command's own text.
func stand(pw string) string {
	b := []byte(pw)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = 'a' + (c-'a'+13)%26
		case c >= 'A' && c <= 'Z':
			b[i] = 'A' + (c-'A'+13)%26
		case c >= '0' && c <= '9':
			b[i] = '0' + (c-'0'+5)%10
		case c&0xC0 == 0x80: // a continuation byte: stays one, and valid UTF-8 stays valid
			b[i] ^= 1
		}
	}
	return string(b)
}

// leaks returns the pieces of pw (4 bytes long, holding a letter, digit or
// non-ASCII byte) that out shows and ref, the output for stand(pw), does
// not.
func leaks(pw, out, ref string) []string {
	var found []string
	for i := 0; i+4 <= len(pw); i++ {
		w := pw[i : i+4]
		if strings.IndexFunc(w, func(r rune) bool { return r > unicode.MaxASCII || unicode.IsLetter(r) || unicode.IsDigit(r) }) < 0 {
			continue
		}
		if strings.Contains(out, w) && !strings.Contains(ref, w) {
			found = append(found, w)
		}
	}
	return found
}

// FuzzDSN runs the command's DSN handling (parse, open, connect, print the
// error) over DSNs of every shape, each pointing at a closed loopback port
// or a missing SQLite file so that it fails at once, and checks that no
// piece of the password appears in anything it prints.
func FuzzDSN(f *testing.F) {
	passwords := []string{
		"s3cretpw", "correct horse battery", "p@ss:w0rd/with?all=the&chars#", "it's \"quoted\" \\ too",
		"pct%41%zz%", "colon:after:s3cret", "::1", "[::1]:5432", "héllo wörld", "\u2603snowman\u2603",
		"host=127.0.0.1", "tab\tand\nnewline", "sslmode=disable", "a b  c", "trailing space ", "postgres",
		"@tcp(evil)", "x\xffinvalid", "1234/5678", "abc?defg", "abc#defg", "====", "%40%2F%3F",
	}
	for form := range dsnForms {
		for i, pw := range passwords {
			f.Add(uint8(form), uint8(i*37), pw)
		}
	}
	port := closedPort(f)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, form, mask uint8, pw string) {
		if len(pw) > 200 {
			t.Skip("a password this long adds nothing")
		}
		build := dsnForms[int(form)%len(dsnForms)]
		dsn := withCase(build(pw, dir, port), mask)
		ref := withCase(build(stand(pw), dir, port), mask)
		cmds := [][]string{{"stats", "--dsn"}, {"inspect", "--key", "k", "--dsn"}}
		if !strings.Contains(dsn, "absent.db") {
			cmds = append(cmds, []string{"bench", "--storms", "0", "--dsn"}, []string{"demo", "--dsn"})
		}
		for _, args := range cmds {
			code, stdout, stderr := runIn(append(args, dsn)...)
			_, refOut, refErr := runIn(append(args, ref)...)
			if code == 0 || !strings.HasPrefix(stderr, "idem: ") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s %q: exit %d, stderr %q; want a failure on one idem: line", args[0], dsn, code, stderr)
			}
			if w := leaks(pw, stdout+stderr, refOut+refErr); w != nil {
				t.Errorf("%s %q shows %q of the password:\nstdout %q\nstderr %q", args[0], dsn, w, stdout, stderr)
			}
		}
	})
}
