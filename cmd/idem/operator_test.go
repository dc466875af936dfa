package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// inspect shows a lease only on a record in flight, and one line on the
// response of every record: the response, sealed (without its keys), or
// gone (past retention), never two that disagree.
func TestInspectLeaseAndResponseLines(t *testing.T) {
	now := time.Now()
	resp := &idem.Response{StatusCode: 201, Body: []byte("ok")}
	for name, c := range map[string]struct {
		rec        idem.Record
		lease      bool
		response   string // the one response line's value
		notPresent []string
	}{
		"processing": {idem.Record{Status: idem.StatusProcessing, LeaseUntil: now.Add(14 * time.Second)}, true, "", nil},
		"completed": {idem.Record{Status: idem.StatusCompleted, LeaseUntil: now.Add(14 * time.Second), CompletedAt: now, ExpiresAt: now.Add(time.Hour), Response: resp},
			false, "201 Created, 2 bytes", nil},
		"completed, sealed": {idem.Record{Status: idem.StatusCompleted, LeaseUntil: now.Add(time.Second), CompletedAt: now, ExpiresAt: now.Add(time.Hour), SealedKey: "k2026a"},
			false, "sealed (key k2026a): give --keys-file to open it", nil},
		"released": {idem.Record{Status: idem.StatusReleased, LeaseUntil: now.Add(time.Second)}, false, "", nil},
		"expired, sealed": {idem.Record{Status: idem.StatusExpired, Expired: true, LeaseUntil: now.Add(14 * time.Second), CompletedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour), SealedKey: "k2026a"},
			false, "gone: past its retention (the key is kept, without its response, until the key memory passes)", []string{"sealed"}},
		"completed past retention, key memory": {idem.Record{Status: idem.StatusCompleted, Expired: true, LeaseUntil: now.Add(-time.Hour), CompletedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour), SealedKey: "k2026a", Response: resp},
			false, "gone: past its retention (the key is kept, without its response, until the key memory passes)", []string{"sealed", "201", "body"}},
		"forgotten": {idem.Record{Status: idem.StatusCompleted, Forgotten: true, CompletedAt: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute), Response: resp},
			false, "gone: past its retention (the key is forgotten, the record awaits purge)", []string{"201", "body"}},
	} {
		c.rec.Scope, c.rec.Key, c.rec.Now, c.rec.CreatedAt = "s", "k", now, now.Add(-time.Hour)
		var buf bytes.Buffer
		printRecord(&buf, &c.rec)
		out := buf.String()
		if got := strings.Contains(out, "lease until"); got != c.lease {
			t.Errorf("%s: a lease line: %v, want %v:\n%s", name, got, c.lease, out)
		}
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "response") {
				lines = append(lines, strings.TrimSpace(strings.TrimPrefix(l, "response")))
			}
		}
		switch {
		case c.response == "" && len(lines) != 0:
			t.Errorf("%s: response lines %q, want none:\n%s", name, lines, out)
		case c.response != "" && (len(lines) != 1 || lines[0] != c.response):
			t.Errorf("%s: response lines %q, want one: %q:\n%s", name, lines, c.response, out)
		}
		for _, no := range c.notPresent {
			if strings.Contains(strings.SplitN(out, "\nexpires", 2)[1], no) {
				t.Errorf("%s: %q shown:\n%s", name, no, out)
			}
		}
	}
}

// stats counts each status once under its name, and the records past
// their own expiry under another ("past expiry"), whatever --retention
// says: a record whose own retention was 1ms is past it, one of an hour
// is not.
func TestStatsNames(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "stats.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idem.New(idem.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	for key, retention := range map[string]time.Duration{"short": time.Millisecond, "long": time.Hour} {
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := s.Do(ctx, tx, idem.Request{Key: key, Operation: "op", Fingerprint: "f", Retention: retention},
				func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 201}, nil })
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	r := idemCmd(t, "stats", "--dsn", "sqlite:"+path, "--retention", "24h")
	if r.code != 0 {
		t.Fatalf("stats: exit %d: %s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "retention") || strings.Count(r.stdout, "expired") > 0 ||
		!regexp.MustCompile(`(?m)^  completed +2$`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^past expiry +1 `).MatchString(r.stdout) {
		t.Errorf("stats: want completed 2, past expiry 1, and nothing of the flag's retention nor a second \"expired\":\n%s", r.stdout)
	}
	r = idemCmd(t, "stats", "--dsn", "sqlite:"+path, "--json")
	var j map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil || j["past_expiry"] != float64(1) || j["expired"] != nil {
		t.Errorf("stats --json: want past_expiry 1 and no top-level expired: %v\n%s", err, r.stdout)
	}
	if st, _ := j["by_status"].(map[string]any); st == nil || st["expired"] != float64(0) || st["completed"] != float64(2) {
		t.Errorf("stats --json: want by_status with every status, expired 0, completed 2:\n%s", r.stdout)
	}
}
