package idem

import (
	"errors"
	"net/http"
	"reflect"
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
	for name, s := range map[string]*Store{
		"nil dialect": New(nil),
		"lease":       New(Postgres, WithLease(0)),
		"retention":   New(MySQL, WithRetention(-time.Second)),
		"table":       New(Postgres, WithTable("x y")),
	} {
		if s.err == nil {
			t.Errorf("%s: no configuration error", name)
		}
		if _, err := s.Do(t.Context(), nil, Request{Key: "k"}, nil); err != s.err {
			t.Errorf("%s: Do returned %v, want the configuration error", name, err)
		}
	}
}

func TestSchemaStatementsUseTheTableName(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL} {
		stmts := d.schema([]string{"billing", "keys"})
		all := strings.Join(stmts, "\n")
		if strings.Contains(all, DefaultTable) || !strings.Contains(all, "keys_created_at_idx") {
			t.Errorf("%s: DDL for billing.keys:\n%s", d.Name(), all)
		}
		for _, s := range stmts {
			if strings.Contains(s, ";") {
				t.Errorf("%s: statement holds a ';': %s", d.Name(), s)
			}
		}
	}
}
