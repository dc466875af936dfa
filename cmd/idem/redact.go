package main

import (
	"context"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// redactor holds the secrets of one run of the command (the DSN and every
// password in it); exitCode scrubs them from the error it prints. A driver's
// error may quote the DSN it was given, and a message the command writes
// itself must not show one either.
type redactor struct {
	mu      sync.Mutex
	secrets []string
}

type redactorKey struct{}

func withRedactor(ctx context.Context, r *redactor) context.Context {
	return context.WithValue(ctx, redactorKey{}, r)
}

// redactorFrom is the redactor of ctx, or nil (which ignores what it is
// given) outside run.
func redactorFrom(ctx context.Context) *redactor {
	r, _ := ctx.Value(redactorKey{}).(*redactor)
	return r
}

// add registers secrets along with the forms a message may quote them in:
// percent-encoded and Go-quoted.
func (r *redactor) add(secrets ...string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range secrets {
		if s == "" {
			continue
		}
		q := strconv.Quote(s)
		r.secrets = append(r.secrets, s, q[1:len(q)-1], url.QueryEscape(s), url.PathEscape(s),
			strings.Join(strings.Fields(s), " "))
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	r.secrets = slices.Compact(r.secrets)
}

// redacted stands for a secret in a message.
const redacted = "[redacted]"

// scrub replaces every occurrence of a secret in msg, longest first.
func (r *redactor) scrub(msg string) string {
	if r == nil {
		return msg
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return msg
}

// passwordParam matches a password setting in a query string or a
// key=value DSN: pgx takes password= and sslpassword= in both.
var passwordParam = regexp.MustCompile(`(?i)(?:^|[\s?&;])(?:ssl)?(?:password|passwd|pass|pwd)\s*=\s*`)

// dsnSecrets returns every part of dsn that may be a password, whatever
// the DSN's form and however malformed it is: the whole DSN; the text
// between the user name and the last '@' (the password of a URL or of a
// go-sql-driver DSN, as written and decoded, up to that '@' and up to the
// end of the host part); and the value of every password setting, quoted
// or not, as written and unescaped. It errs on the side of too much.
func dsnSecrets(dsn string) []string {
	secrets := []string{dsn}
	withDecoded := func(s string) {
		secrets = append(secrets, s)
		if d, err := url.PathUnescape(s); err == nil {
			secrets = append(secrets, d)
		}
		if d, err := url.QueryUnescape(s); err == nil {
			secrets = append(secrets, d)
		}
	}
	rest := dsn
	if _, after, ok := strings.Cut(dsn, "://"); ok {
		rest = after
	}
	for _, userinfo := range []string{rest, rest[:strings.IndexAny(rest+"/", "/?#")]} {
		if at := strings.LastIndex(userinfo, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(userinfo[:at], ":"); ok {
				withDecoded(pw)
			}
		}
	}
	for _, loc := range passwordParam.FindAllStringIndex(dsn, -1) {
		v := dsn[loc[1]:]
		withDecoded(v)
		if strings.HasPrefix(v, "'") {
			withDecoded(quotedValue(v[1:]))
			continue
		}
		if end := strings.IndexAny(v, " \t\r\n&;#"); end >= 0 {
			withDecoded(v[:end])
		}
	}
	return secrets
}

// quotedValue reads a single-quoted key=value setting after its opening
// quote, with libpq's \' and \\ escapes, up to the closing quote or the end.
func quotedValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
		case s[i] == '\'':
			return b.String()
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
