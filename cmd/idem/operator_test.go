package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// sealedTable makes an SQLite database at path whose table holds n
// records sealed with k1 that replay for an hour, one sealed with k1
// past its expiry ("gone"), and one stored in the clear ("clear"); it
// returns the database and a Store that opens with k1 and k2.
func sealedTable(t *testing.T, path string, n int) (*sql.DB, *idem.Store) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store := func(current string) *idem.Store {
		sealer, err := idem.NewAESGCMSealer(current, map[string][]byte{"k1": bytes.Repeat([]byte{1}, 32), "k2": bytes.Repeat([]byte{2}, 32)})
		if err != nil {
			t.Fatal(err)
		}
		s, err := idem.New(idem.SQLite, idem.WithSealer(sealer))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	k1, plain := store("k1"), func() *idem.Store { s, _ := idem.New(idem.SQLite); return s }()
	if err := k1.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	do := func(s *idem.Store, key string, retention time.Duration) func(tx *sql.Tx) error {
		return func(tx *sql.Tx) error {
			_, err := s.Do(ctx, tx, idem.Request{Key: key, Operation: "op", Fingerprint: "f", Retention: retention},
				func(context.Context) (idem.Response, error) {
					return idem.Response{StatusCode: 201, Body: []byte(key)}, nil
				})
			return err
		}
	}
	err = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		for i := range n {
			if err := do(k1, fmt.Sprintf("live-%d", i), time.Hour)(tx); err != nil {
				return err
			}
		}
		if err := do(k1, "gone", time.Millisecond)(tx); err != nil {
			return err
		}
		return do(plain, "clear", time.Hour)(tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	return db, store("k2")
}

// keysFile writes the keys of sealedTable, k2 last (current).
func keysFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	text := "k1 " + strings.Repeat("01", 32) + "\nk2 " + strings.Repeat("02", 32) + "\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// reseal says what it has to do, reports each batch with the rate and
// what is left, and skips a record past its expiry, which stays sealed
// with its old key.
func TestResealProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reseal.db")
	db, s := sealedTable(t, path, 3)
	r := idemCmd(t, "reseal", "--dsn", "sqlite:"+path, "--keys-file", keysFile(t), "--batch", "2", "--progress", "0")
	if r.code != 0 {
		t.Fatalf("reseal: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^4 records of idempotency_keys to reseal with key k2 \(records past their expiry are skipped\)$`),
		regexp.MustCompile(`(?m)^batch 1: resealed 2 \(2 so far, \d+ records/s, about 2 left\)$`),
		regexp.MustCompile(`(?m)^batch 2: resealed 2 \(4 so far, \d+ records/s, about 0 left\)$`),
		regexp.MustCompile(`(?m)^resealed 4 records of idempotency_keys in `),
	} {
		if !want.MatchString(r.stdout) {
			t.Errorf("reseal: want a line matching %s:\n%s", want, r.stdout)
		}
	}
	for key, want := range map[string]string{"live-0": "k2", "live-2": "k2", "clear": "k2", "gone": "k1"} {
		rec, err := s.Inspect(context.Background(), db, "", key)
		if err != nil || rec == nil || rec.SealedKey != want {
			t.Errorf("record %s after reseal: %+v, %v; want it sealed with %s", key, rec, err, want)
		}
	}
}

// reseal stopped by SIGINT says how far it went and how to go on; run
// again, it reseals only what is left.
func TestResealStopsAndResumes(t *testing.T) {
	const n = 2000
	path := filepath.Join(t.TempDir(), "resume.db")
	db, s := sealedTable(t, path, n)
	keys := keysFile(t)
	cmd := exec.Command(bin, "reseal", "--dsn", "sqlite:"+path, "--keys-file", keys, "--batch", "1", "--progress", "0")
	cmd.Env = append(os.Environ(), "IDEM_DSN=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "batch 1:") {
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
	}
	err = cmd.Wait()
	stopped := regexp.MustCompile(`reseal stopped after resealing (\d+) records? .*run the same command again to go on`).FindStringSubmatch(stderr.String())
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 1 || stopped == nil {
		t.Fatalf("reseal interrupted: %v, stderr %q; want exit 1 and how far it went", err, stderr.String())
	}
	done, _ := strconv.Atoi(stopped[1])
	if done < 1 || done >= n+1 {
		t.Fatalf("reseal interrupted after %d records; want some, not all", done)
	}
	r := idemCmd(t, "reseal", "--dsn", "sqlite:"+path, "--keys-file", keys, "--batch", "500")
	if want := "resealed " + plural(n+1-done, "record") + " "; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Errorf("reseal run again: exit %d, want %q:\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	st, err := s.ResealLeft(context.Background(), db)
	if err != nil || st != 0 {
		t.Errorf("left after the second run: %d, %v; want 0", st, err)
	}
}
