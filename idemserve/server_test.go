package idemserve

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// New refuses a Config it cannot serve, naming the layer and what to
// change.
func TestNewRefuses(t *testing.T) {
	store, err := idem.New(idem.Postgres, idem.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	db := &sql.DB{}
	for want, cfg := range map[string]Config{
		"needs a Store": {Layer: "x", DB: db},
		"needs the database its transactions run on": {Layer: "x", Store: store},
		"both a DB and a Runner":                     {Layer: "x", Store: store, DB: db, Runner: idem.NewSQLRunner(db, nil)},
		"TxOptions are database/sql's":               {Layer: "x", Store: store, Runner: idem.NewSQLRunner(db, nil), TxOptions: &sql.TxOptions{}},
		"unknown Mode 7":                             {Layer: "x", Store: store, DB: db, Mode: 7},
		"must not be negative, got -1s and 0s":       {Layer: "x", Store: store, DB: db, Timeout: -time.Second},
		"exceeds the Store's lease 10s":              {Layer: "x", Store: store, DB: db, Mode: ModeClaim, Timeout: 11 * time.Second},
	} {
		if s, err := New(cfg); s != nil || err == nil || !strings.HasPrefix(err.Error(), "x: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v; want an error of layer x saying %q", cfg, err, want)
		}
	}
}

// Timeout defaults to DefaultTimeout, and in ModeClaim to the Store's
// lease when that is shorter; RetryAfter to DefaultRetryAfter.
func TestNewDefaults(t *testing.T) {
	db := &sql.DB{}
	for _, c := range []struct {
		lease   time.Duration
		mode    Mode
		timeout time.Duration
		want    time.Duration
	}{
		{idem.DefaultLease, ModeTransaction, 0, DefaultTimeout},
		{5 * time.Second, ModeTransaction, 0, DefaultTimeout},
		{5 * time.Second, ModeTransaction, time.Minute, time.Minute},
		{idem.DefaultLease, ModeClaim, 0, DefaultTimeout},
		{5 * time.Second, ModeClaim, 0, 5 * time.Second},
		{5 * time.Second, ModeClaim, 5 * time.Second, 5 * time.Second},
		{time.Minute, ModeClaim, 0, DefaultTimeout},
		{time.Minute, ModeClaim, 45 * time.Second, 45 * time.Second},
	} {
		store, err := idem.New(idem.Postgres, idem.WithLease(c.lease))
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Layer: "test", Store: store, DB: db, Mode: c.mode, Timeout: c.timeout})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if s.cfg.Timeout != c.want || s.cfg.RetryAfter != DefaultRetryAfter {
			t.Errorf("lease %v, mode %d, Timeout %v: Timeout %v and RetryAfter %v; want %v and %v", c.lease, c.mode, c.timeout, s.cfg.Timeout, s.cfg.RetryAfter, c.want, DefaultRetryAfter)
		}
	}
}

// Standbys is refused where the Store's dialect cannot wait for standbys,
// naming what it offers, and out of range; StandbyWait defaults to
// DefaultStandbyWait.
func TestNewStandbys(t *testing.T) {
	db := &sql.DB{}
	pg, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	maria, err := idem.New(idem.MariaDB)
	if err != nil {
		t.Fatal(err)
	}
	for want, cfg := range map[string]Config{
		"not supported on mariadb: on MySQL and MariaDB use semi-synchronous replication": {Layer: "x", Store: maria, DB: db, Standbys: 1},
		"must not be negative, got -1 and 0s":                                             {Layer: "x", Store: pg, DB: db, Standbys: -1},
		"StandbyWait 1s is set but Standbys is 0":                                         {Layer: "x", Store: pg, DB: db, StandbyWait: time.Second},
	} {
		if s, err := New(cfg); s != nil || err == nil || !strings.HasPrefix(err.Error(), "x: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v; want an error of layer x saying %q", cfg, err, want)
		}
	}
	s, err := New(Config{Layer: "x", Store: pg, DB: db, Standbys: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.StandbyWait != DefaultStandbyWait {
		t.Errorf("StandbyWait %v, want %v", s.cfg.StandbyWait, DefaultStandbyWait)
	}
	if o := s.Outcome(&idem.NotReplicatedError{Want: 2}); o.Kind != NotReplicated || o.RetryAfter != DefaultRetryAfter {
		t.Errorf("Outcome of a NotReplicatedError: %+v", o)
	}
}
