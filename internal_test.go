package idem

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"X-Multi": {"a", "", "c"}, "x-lower": {"v"}, "Empty": {}, "Bytes": {"\x00\x80\xff caf\xc3\xa9"}},
	} {
		got, err := decodeHeader(encodeHeader(h))
		if err != nil {
			t.Fatalf("%q: %v", h, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip of %q gave %q", h, got)
		}
	}
}

func TestDecodeHeaderRefusesCorruptInput(t *testing.T) {
	good := encodeHeader(http.Header{"A": {"bc"}})
	for _, b := range [][]byte{{}, {2}, good[:len(good)-1], append(append([]byte{}, good...), 0), {1, 5}} {
		if _, err := decodeHeader(b); !errors.Is(err, errCorruptHeader) {
			t.Errorf("%v: err = %v, want errCorruptHeader", b, err)
		}
	}
}

func TestParseTable(t *testing.T) {
	for _, ok := range []string{"idempotency_keys", "billing.idem", "_t9", strings.Repeat("a", 48)} {
		if _, err := parseTable(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b.c", "9t", "t-1", "t;", `"t"`, "a.", ".a", "tåble", strings.Repeat("a", 49)} {
		if _, err := parseTable(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestInFlightRoundsUp(t *testing.T) {
	for left, want := range map[time.Duration]time.Duration{
		-time.Second:            time.Second,
		time.Microsecond:        time.Second,
		time.Second:             time.Second,
		time.Second + 1:         2 * time.Second,
		29*time.Second + 999999: 30 * time.Second,
	} {
		if got := inFlight(left).RetryAfter; got != want {
			t.Errorf("lease left %v: RetryAfter %v, want %v", left, got, want)
		}
	}
}

func TestNewReportsBadOptions(t *testing.T) {
	for name, c := range map[string]struct {
		d    Dialect
		opts []Option
		want string
	}{
		"nil dialect":        {nil, nil, "needs a Dialect"},
		"zero lease":         {Postgres, []Option{WithLease(0)}, "lease must be positive"},
		"negative retention": {MySQL, []Option{WithRetention(-time.Second)}, "retention must be positive"},
		// Past MaxInt64-999ns the conversion to microseconds overflowed and
		// the database got a negative interval: every claim was born
		// expired and every record forgotten.
		"lease that overflows":     {Postgres, []Option{WithLease(math.MaxInt64)}, "at most 876000h0m0s"},
		"retention that overflows": {SQLite, []Option{WithRetention(math.MaxInt64)}, "at most 876000h0m0s"},
		"retention past bound":     {MySQL, []Option{WithRetention(MaxDuration + 1)}, "MaxDuration"},
		"table":                    {Postgres, []Option{WithTable("x y")}, "table name"},
		"lock timeout":             {Postgres, []Option{WithLockTimeout(0)}, "lock timeout"},
	} {
		s, err := New(c.d, c.opts...)
		if err == nil || s != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New returned %v, %v; want nil and an error with %q", name, s, err, c.want)
		}
	}
	for _, d := range []time.Duration{time.Microsecond, MaxDuration} {
		if _, err := New(Postgres, WithLease(d), WithRetention(d)); err != nil {
			t.Errorf("lease and retention %v: %v", d, err)
		}
	}
}

func TestSchemaStatementsUseTheTableName(t *testing.T) {
	for _, d := range dialects {
		st := d.statements([]string{"billing", "keys"})
		var stmts []string
		for _, step := range st.Migrations {
			stmts = append(stmts, step...)
		}
		all := strings.Join(stmts, "\n")
		if strings.Contains(all, DefaultTable) || !strings.Contains(all, "keys_created_at_idx") {
			t.Errorf("%s: DDL for billing.keys:\n%s", d.Name(), all)
		}
		for _, s := range stmts {
			if strings.Contains(s, ";") {
				t.Errorf("%s: statement holds a ';': %s", d.Name(), s)
			}
		}
		if q := st.query(st.Version, &values{}); placeholders(q.SQL) != len(q.Args) || strings.Contains(q.SQL, DefaultTable) {
			t.Errorf("%s: version: %d placeholders, %d arguments:\n%s", d.Name(), placeholders(q.SQL), len(q.Args), q.SQL)
		}
	}
}

// A table's comment records its schema version from version 2 on; a table
// without one is of version 1.
// A migration that gives the records without an expiry one (MySQL's
// version 4) is written with the default retention, and runs with the
// Store's; the column's default, in the same migration, keeps the
// default's, so that every Store's table has the same layout.
func TestMigrationsTakeTheStoresRetention(t *testing.T) {
	if want := fmt.Sprintf("INTERVAL %d MICROSECOND", DefaultRetention.Microseconds()); retentionInMigrations != want {
		t.Fatalf("the migrations' default retention is %q, want %q", retentionInMigrations, want)
	}
	s, err := New(MariaDB, WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var updates, defaults int
	for _, stmt := range s.st.Migrations[3] { // version 4's
		switch {
		case strings.HasPrefix(stmt, "UPDATE "):
			updates++
			if !strings.Contains(stmt, "INTERVAL 3600000000 MICROSECOND") || strings.Contains(stmt, retentionInMigrations) {
				t.Errorf("the UPDATE does not take the Store's retention of an hour:\n%s", stmt)
			}
		case strings.Contains(stmt, "DEFAULT (("), strings.Contains(stmt, "SET DEFAULT (("):
			defaults++
			if !strings.Contains(stmt, retentionInMigrations) {
				t.Errorf("the column's default does not keep the default retention:\n%s", stmt)
			}
		}
	}
	if updates != 1 || defaults != 2 {
		t.Fatalf("MySQL's migration to version 4 has %d UPDATE and %d column defaults, want 1 and 2 (set, then kept)", updates, defaults)
	}
}

func TestVersionComment(t *testing.T) {
	for comment, want := range map[string]int{
		"":                             1,
		"idem schema 2":                2,
		"billing keys; idem schema 12": 12,
		"idem schema 1":                1,
		"idem schema two":              1,
		"not idem schema 3x":           1,
	} {
		if got := commentVersion(comment); got != want {
			t.Errorf("comment %q: version %d, want %d", comment, got, want)
		}
	}
}

// Every statement of every dialect (each field of its statements, found
// by reflection, so that a new one is checked too) names the Store's
// table, never the default one it is written for, and takes as many
// arguments as it has placeholders; the claim statements are read back
// by claimed where they do not return the token and the lag, and only
// there.
func TestStatementsAreWhole(t *testing.T) {
	for _, d := range dialects {
		st := d.statements([]string{"billing", "keys"})
		returnsAll := st.InsertReturns == Returning{true, true} && st.TakeoverReturns == Returning{true, true}
		if (st.Claimed.SQL == "") != returnsAll {
			t.Errorf("%s: claimed %q, but the claim statements return %v and %v", d.Name(), st.Claimed.SQL, st.InsertReturns, st.TakeoverReturns)
		}
		// A dialect whose purge windows are read ahead (purgeStart) bounds
		// each window's read and each batch's statements; no other does,
		// but for strip, which every dialect bounds at its window's end, so
		// that a batch without a tombstone to make scans no further.
		if !slices.Contains(st.Strip.Args, ArgTo) {
			t.Errorf("%s: strip does not stop at ArgTo:\n%s", d.Name(), st.Strip.SQL)
		}
		// purgeHeld and stripHeld come together, where purge and strip
		// wait for held rows but a bounded wait can end at once.
		if (st.purgeHeld.SQL == "") != (st.stripHeld.SQL == "") {
			t.Errorf("%s: purgeHeld %q and stripHeld %q: want both or neither", d.Name(), st.purgeHeld.SQL, st.stripHeld.SQL)
		}
		if st.purgeHeld.SQL != "" && d.lockWaiter() == nil {
			t.Errorf("%s has purgeHeld but cannot bound a lock wait", d.Name())
		}
		if st.stripHeld.SQL != "" && !slices.Contains(st.stripHeld.Args, ArgTo) {
			t.Errorf("%s: stripHeld does not stop at ArgTo:\n%s", d.Name(), st.stripHeld.SQL)
		}
		for _, sweep := range []struct {
			start           Statement
			window, batches []Statement
		}{
			{st.purgeStart, []Statement{st.PurgeWindow}, []Statement{st.Purge}},
			{st.legacyStart, []Statement{st.LegacyWindow}, []Statement{st.LegacyPurge}},
		} {
			spanned := sweep.start.SQL != ""
			for _, q := range sweep.window {
				if slices.Contains(q.Args, ArgUpto) != spanned {
					t.Errorf("%s: a window read that stops at ArgUpto: %v, want %v (it has a start statement: %v):\n%s", d.Name(), !spanned, spanned, spanned, q.SQL)
				}
			}
			for _, q := range sweep.batches {
				if slices.Contains(q.Args, ArgTo) != spanned {
					t.Errorf("%s: a batch statement that stops at ArgTo: %v, want %v:\n%s", d.Name(), !spanned, spanned, q.SQL)
				}
			}
		}
		v := reflect.ValueOf(st).Elem()
		for i := range v.NumField() {
			if v.Field(i).Type() != reflect.TypeFor[Statement]() {
				continue
			}
			name, q := v.Type().Field(i).Name, *(*Statement)(v.Field(i).Addr().UnsafePointer())
			if q.SQL == "" && (name == "claimed" || name == "built" || name == "readAfterClaim" || name == "completeLast" || name == "purgeStart" || name == "legacyStart" || name == "replicated" || name == "flushed" || name == "purgeHeld" || name == "stripHeld") {
				continue // a statement the dialect has no need of
			}
			if strings.Contains(q.SQL, DefaultTable) || !strings.Contains(q.SQL, "keys") && name != "size" && name != "version" && name != "built" && name != "replicated" && name != "flushed" {
				t.Errorf("%s %s does not name the table billing.keys:\n%s", d.Name(), name, q.SQL)
			}
			if n := placeholders(q.SQL); n != len(q.Args) {
				t.Errorf("%s %s: %d placeholders, %d arguments:\n%s", d.Name(), name, n, len(q.Args), q.SQL)
			}
		}
	}
}

// placeholders counts a statement's "?" or, for $n, its largest n.
func placeholders(sql string) int {
	n := strings.Count(sql, "?")
	for _, m := range dollarPlaceholder.FindAllStringSubmatch(sql, -1) {
		if i, _ := strconv.Atoi(m[1]); i > n {
			n = i
		}
	}
	return n
}

var dollarPlaceholder = regexp.MustCompile(`\$([0-9]+)`)

// The completed-key hint knows a key once added, tells scopes apart, and
// holds one key per slot: a later key in the same slot replaces it.
func TestCompletedHint(t *testing.T) {
	var c completedKeys
	a := Request{Scope: "tenant-1", Key: "k"}
	b := Request{Scope: "tenant-2", Key: "k"}
	if c.has(a.Scope, a.Key) {
		t.Fatal("an empty hint has a key")
	}
	c.add(a.Scope, a.Key)
	if !c.has(a.Scope, a.Key) || c.has(b.Scope, b.Key) {
		t.Fatalf("after adding a: has(a) %v, has(b) %v; want true, false", c.has(a.Scope, a.Key), c.has(b.Scope, b.Key))
	}
	for i := 0; ; i++ {
		r := Request{Scope: "tenant-1", Key: strconv.Itoa(i)}
		if keyHash(r.Scope, r.Key)%completedSlots == keyHash(a.Scope, a.Key)%completedSlots && keyHash(r.Scope, r.Key) != keyHash(a.Scope, a.Key) {
			c.add(r.Scope, r.Key)
			break
		}
	}
	if c.has(a.Scope, a.Key) {
		t.Fatal("a key evicted from its slot is still there")
	}
}
