package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/sfv"
)

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		f          dbFlags
		scope, key string
		limit      int
		retention  time.Duration
		keyMemory  time.Duration
		seal       sealFlags
		asJSON     bool
	)
	fs := newFlags("inspect", "--dsn DSN --key KEY [--scope SCOPE] [--limit 100] [--table NAME] [--retention 24h] [--key-memory 0] [--keys-file FILE] [--json]",
		"Shows the records of one Idempotency-Key: status, operation, fingerprint,\n"+
			"fencing token, age, the lease end of a claim in flight, the expiry, the\n"+
			"reference to what the request created (kept past its response), and\n"+
			"the stored response in one line: gone (past retention), sealed, or the\n"+
			"response (its body if it is text). With --scope, the record of the key\n"+
			"in that scope; without it, the key's record in every scope, found by a\n"+
			"scan of the whole table. KEY is taken as the client sent it: \"K\" (an\n"+
			"sf-string, as idemhttp reads the header) or K. A response sealed at rest\n"+
			"shows as \"sealed (key ID)\" unless --keys-file gives the keys that open\n"+
			"it. Reads only; locks nothing. Exit code 1 when there is no record.", stderr)
	f.register(fs)
	fs.StringVar(&scope, "scope", "", "the key's scope (user, tenant, API client); may be empty (--scope '')")
	fs.StringVar(&key, "key", "", "the Idempotency-Key, as the client sent it: \"K\" or K (required)")
	fs.IntVar(&limit, "limit", 100, "without --scope, the most records shown")
	fs.DurationVar(&retention, "retention", idem.DefaultRetention, "the application's retention, to tell whether a record of a release before per-request retention is forgotten")
	fs.DurationVar(&keyMemory, "key-memory", 0, "the application's key memory (idem.WithKeyMemory), to tell whether an expired record is forgotten")
	seal.register(fs, "")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	scoped := false
	fs.Visit(func(fl *flag.Flag) { scoped = scoped || fl.Name == "scope" })
	if key == "" {
		return usageErr("inspect: --key is required")
	}
	if limit <= 0 {
		return usageErr("inspect: --limit must be positive, got %d", limit)
	}
	keys, err := keyForms(key)
	if err != nil {
		return usageErr("inspect: --key: %s", strings.TrimPrefix(err.Error(), "idem: "))
	}
	sealer, err := seal.sealer("inspect")
	if err != nil {
		return err
	}
	opts := []idem.Option{idem.WithRetention(retention), idem.WithKeyMemory(keyMemory)}
	if sealer != nil {
		opts = append(opts, idem.WithSealer(sealer))
	}
	db, _, s, err := f.open(ctx, false, opts...)
	if err != nil {
		return err
	}
	defer db.Close()
	if scoped {
		for _, k := range keys {
			rec, err := s.Inspect(ctx, db, scope, k)
			if err != nil {
				return err
			}
			if rec != nil {
				if asJSON {
					return writeJSON(stdout, inspectJSON(rec))
				}
				printRecord(stdout, rec)
				return nil
			}
		}
		return failure("no record for key %s in scope %q of %s", keyDesc(key, keys), scope, s.Table())
	}
	for _, k := range keys {
		recs, err := s.InspectKey(ctx, db, k, limit+1)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			continue
		}
		more := len(recs) > limit
		recs = recs[:min(len(recs), limit)]
		if asJSON {
			j := scanJSON{Key: k, ScannedEveryScope: true, More: more, Records: []recordJSON{}}
			for i := range recs {
				j.Records = append(j.Records, inspectJSON(&recs[i]))
			}
			return writeJSON(stdout, j)
		}
		fmt.Fprintf(stdout, "no --scope: scanned every scope of %s for key %q: %s\n", s.Table(), k, plural(len(recs), "record"))
		if more {
			fmt.Fprintf(stdout, "more scopes hold it than --limit %d shows; give --scope, or a larger --limit\n", limit)
		}
		for i := range recs {
			fmt.Fprintln(stdout)
			printRecord(stdout, &recs[i])
		}
		return nil
	}
	return failure("no record for key %s in any scope of %s (no --scope: scanned every scope)", keyDesc(key, keys), s.Table())
}

// keyForms returns the keys that the value of --key may stand for, as an
// Idempotency-Key field would carry them: an sf-string ("K", with the
// escapes \" and \\) stands for its content, as idemhttp reads the
// header, and any valid key for itself (a client that is not HTTP's may
// send quotes). The sf-string's content comes first. Spaces and tabs
// around the value are dropped, as idemhttp drops them.
func keyForms(v string) ([]string, error) {
	v = strings.Trim(v, " \t")
	var (
		forms    []string
		content  string
		notAsSF  string // why v does not stand for a key as an sf-string
		reason   = func(err error) string { return strings.TrimPrefix(err.Error(), idem.ErrInvalidKey.Error()+": ") }
		asIs     = idem.ValidateKey(v)
		isString = strings.HasPrefix(v, `"`)
	)
	if isString {
		content, notAsSF = sfv.String(v)
		if notAsSF == "" {
			if err := idem.ValidateKey(content); err != nil {
				notAsSF = fmt.Sprintf("its content %q: %s", content, reason(err))
			} else {
				forms = append(forms, content)
			}
		}
	}
	if asIs == nil {
		forms = append(forms, v)
	}
	switch {
	case len(forms) > 0:
		return forms, nil
	case isString:
		return nil, fmt.Errorf("%w: %q is no key as an sf-string (%s) nor as it is (%s)", idem.ErrInvalidKey, v, notAsSF, reason(asIs))
	}
	return nil, asIs
}

// keyDesc names the keys an --key value v stood for, for a message.
func keyDesc(v string, keys []string) string {
	v = strings.Trim(v, " \t")
	switch {
	case len(keys) == 2:
		return fmt.Sprintf("%q (read from the sf-string %q) nor %q (as typed)", keys[0], v, keys[1])
	case keys[0] != v:
		return fmt.Sprintf("%q (read from the sf-string %q)", keys[0], v)
	}
	return strconv.Quote(v)
}

func printRecord(w io.Writer, r *idem.Record) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("scope", "%q", r.Scope)
	row("key", "%q", r.Key)
	status := shown(string(r.Status))
	switch {
	case r.Forgotten:
		status += " (past retention: forgotten, awaiting purge)"
	case r.Expired:
		status += " (past retention: its response is gone, the key is refused until the key memory passes)"
	}
	row("status", "%s", status)
	row("operation", "%s", shown(r.Operation))
	row("fingerprint", "%s", shown(r.Fingerprint))
	row("token", "%d", r.Token)
	row("created", "%s (age %s)", stamp(r.CreatedAt), ago(r.Now.Sub(r.CreatedAt)))
	if r.Status == idem.StatusProcessing { // a lease means nothing once a claim has ended
		if left := r.LeaseUntil.Sub(r.Now); left > 0 {
			row("lease until", "%s (%s left)", stamp(r.LeaseUntil), ago(left))
		} else {
			row("lease until", "%s (expired %s ago)", stamp(r.LeaseUntil), ago(-left))
		}
	}
	if !r.CompletedAt.IsZero() {
		row("completed", "%s (%s ago)", stamp(r.CompletedAt), ago(r.Now.Sub(r.CompletedAt)))
	}
	if !r.ExpiresAt.IsZero() {
		if left := r.ExpiresAt.Sub(r.Now); left > 0 {
			row("expires", "%s (in %s)", stamp(r.ExpiresAt), ago(left))
		} else {
			row("expires", "%s (%s ago)", stamp(r.ExpiresAt), ago(-left))
		}
	}
	switch {
	case r.Reference != "":
		row("reference", "%s", shown(r.Reference))
	case r.ReferenceSealed:
		row("reference", "sealed: give --keys-file to open it")
	}
	// One line on the response: gone, sealed, or the response itself.
	stored := r.Response != nil || r.SealedKey != "" || r.Status == idem.StatusCompleted || r.Status == idem.StatusExpired
	switch resp := r.Response; {
	case !stored:
	case r.Forgotten:
		row("response", "gone: past its retention (the key is forgotten, the record awaits purge)")
	case r.Expired || r.Status == idem.StatusExpired:
		row("response", "gone: past its retention (the key is kept, without its response, until the key memory passes)")
	case resp == nil:
		row("response", "sealed (key %s): give --keys-file to open it", shown(r.SealedKey))
	default:
		row("response", "%d %s, %d bytes", resp.StatusCode, http.StatusText(resp.StatusCode), len(resp.Body))
		for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[name] {
				row("header", "%s: %s", shown(name), shown(v))
			}
		}
		switch body := string(resp.Body); {
		case !isText(resp.Body):
			row("body", "(binary, %d bytes)", len(resp.Body))
		case strings.HasPrefix(body, `"`) || strings.IndexFunc(body, notPrintable) >= 0:
			row("body", "%s", strconv.Quote(body))
		default:
			row("body", "%s", strings.ReplaceAll(body, "\n", "\n\t"))
		}
	}
	tw.Flush()
}

// shown is a stored string as the text output prints it: as it is when
// every character is printable, else Go-quoted (control bytes, invalid
// UTF-8 and invisible format characters escaped), so that nothing stored
// reaches the operator's terminal as a control sequence. A string that
// starts with a quote is quoted too, not to pass for a quoted one.
func shown(s string) string {
	if strings.HasPrefix(s, `"`) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	return s
}

// notPrintable reports a character of a text body that the text output
// does not print as it is: anything but a printable character, a newline
// or a tab (a carriage return could overwrite what came before it).
func notPrintable(r rune) bool {
	return !unicode.IsPrint(r) && r != '\n' && r != '\t'
}

// isText reports a body a terminal can show: UTF-8 without control
// characters other than newline, tab and carriage return.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

// dur renders a flag's duration without trailing zero units: 24h, 1h30m.
func dur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") }

// ago renders a duration for a person, to the millisecond below a minute
// and to the second above.
func ago(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

type recordJSON struct {
	Scope       string     `json:"scope"`
	Key         string     `json:"key"`
	Status      string     `json:"status"`
	Forgotten   bool       `json:"forgotten"`
	Expired     bool       `json:"expired"`
	Operation   string     `json:"operation"`
	Fingerprint string     `json:"fingerprint"`
	Token       int64      `json:"token"`
	CreatedAt   time.Time  `json:"created_at"`
	LeaseUntil  time.Time  `json:"lease_until"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	SealedKey   string     `json:"sealed_key,omitempty"` // the key the stored response is sealed with
	// Reference is what the request created (idem.Response.Reference),
	// kept past the response within the key memory.
	Reference string `json:"reference,omitempty"`
	// ReferenceSealed reports a sealed reference that the keys given
	// (--keys-file) do not open, or none were.
	ReferenceSealed bool          `json:"reference_sealed,omitempty"`
	Now             time.Time     `json:"now"`
	AgeSeconds      float64       `json:"age_seconds"`
	Response        *responseJSON `json:"response,omitempty"`
}

// scanJSON is the output of inspect --json without --scope.
type scanJSON struct {
	Key string `json:"key"`
	// ScannedEveryScope is always true: the records were found by a scan
	// of the whole table.
	ScannedEveryScope bool         `json:"scanned_every_scope"`
	More              bool         `json:"more"` // more scopes hold the key than --limit shows
	Records           []recordJSON `json:"records"`
}

type responseJSON struct {
	Status  int                 `json:"status"`
	Headers map[string][]string `json:"headers"`
	Size    int                 `json:"size"`
	Body    *string             `json:"body,omitempty"`        // when it is text
	Base64  []byte              `json:"body_base64,omitempty"` // otherwise
}

func inspectJSON(r *idem.Record) recordJSON {
	j := recordJSON{
		Scope: r.Scope, Key: r.Key, Status: string(r.Status), Forgotten: r.Forgotten, Expired: r.Expired,
		SealedKey: r.SealedKey, Reference: r.Reference, ReferenceSealed: r.ReferenceSealed, Operation: r.Operation, Fingerprint: r.Fingerprint, Token: r.Token,
		CreatedAt: r.CreatedAt, LeaseUntil: r.LeaseUntil, Now: r.Now,
		AgeSeconds: r.Now.Sub(r.CreatedAt).Seconds(),
	}
	if !r.CompletedAt.IsZero() {
		j.CompletedAt = &r.CompletedAt
	}
	if !r.ExpiresAt.IsZero() {
		j.ExpiresAt = &r.ExpiresAt
	}
	if resp := r.Response; resp != nil {
		rj := &responseJSON{Status: resp.StatusCode, Headers: resp.Header, Size: len(resp.Body)}
		if rj.Headers == nil {
			rj.Headers = map[string][]string{}
		}
		if isText(resp.Body) {
			body := string(resp.Body)
			rj.Body = &body
		} else {
			rj.Base64 = resp.Body
		}
		j.Response = rj
	}
	return j
}

// writeJSON writes v indented. encoding/json escapes control characters
// and replaces invalid UTF-8; writeJSON also escapes the invisible
// characters it leaves as they are (U+202E, which reverses the text after
// it, and the like), so no stored string can disguise itself on a terminal.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	out := make([]byte, 0, buf.Len())
	for _, r := range buf.String() {
		if r < utf8.RuneSelf || unicode.IsPrint(r) {
			out = utf8.AppendRune(out, r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	_, err := w.Write(out)
	return err
}
