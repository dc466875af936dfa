package idemhttp

import (
	"database/sql"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

func TestNewChecksConfig(t *testing.T) {
	store, err := idem.New(idem.Postgres, idem.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	db := &sql.DB{}
	for name, cfg := range map[string]Config{
		"no Store":            {DB: db, Scope: SingleTenant},
		"no DB":               {Store: store, Scope: SingleTenant},
		"no Scope":            {Store: store, DB: db},
		"unknown Mode":        {Store: store, DB: db, Scope: SingleTenant, Mode: 7},
		"negative MaxBody":    {Store: store, DB: db, Scope: SingleTenant, MaxBody: -1},
		"negative Timeout":    {Store: store, DB: db, Scope: SingleTenant, Timeout: -time.Second},
		"negative RetryAfter": {Store: store, DB: db, Scope: SingleTenant, RetryAfter: -time.Second},
		"Timeout over lease":  {Store: store, DB: db, Scope: SingleTenant, Mode: idemserve.ModeClaim, Timeout: 11 * time.Second},
		"Set-Cookie":          {Store: store, DB: db, Scope: SingleTenant, ReplayHeaders: []string{"X-Ok", "set-cookie"}},
		"Set-Cookie2":         {Store: store, DB: db, Scope: SingleTenant, ReplayHeaders: []string{"Set-Cookie2"}},
		"DB and Runner":       {Store: store, DB: db, Runner: idem.NewSQLRunner(db, nil), Scope: SingleTenant},
		"TxOptions of Runner": {Store: store, Runner: idem.NewSQLRunner(db, nil), TxOptions: &sql.TxOptions{}, Scope: SingleTenant},
	} {
		if m, err := New(cfg); err == nil || m != nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := New(Config{Store: store, DB: db, Scope: SingleTenant, ReplayHeaders: []string{"x-request-id"}}); err != nil {
		t.Errorf("a valid Config: %v", err)
	}
}

// New refuses a Config without Scope, and says what to return and how to
// opt out.
func TestNewRequiresScope(t *testing.T) {
	store, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Store: store, DB: &sql.DB{}})
	if err == nil || !strings.Contains(err.Error(), "authenticated principal, tenant or API client") || !strings.Contains(err.Error(), "idemhttp.SingleTenant") {
		t.Fatalf("New without Scope: %v; want an error saying what Scope returns and naming SingleTenant", err)
	}
	scope, err := SingleTenant(httptest.NewRequest("POST", "/", nil))
	if scope != "" || err != nil {
		t.Fatalf("SingleTenant: %q, %v", scope, err)
	}
}
