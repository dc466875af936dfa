package idemgrpc_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemserve"
)

// New refuses a Config it cannot serve, saying what to change.
func TestNewRefuses(t *testing.T) {
	db, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idem.New(idem.Postgres, idem.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ok := idemgrpc.Config{Store: s, DB: db, Scope: idemgrpc.SingleTenant}
	for _, c := range []struct {
		change func(*idemgrpc.Config)
		want   string
	}{
		{func(c *idemgrpc.Config) { c.Store = nil }, "needs a Store"},
		{func(c *idemgrpc.Config) { c.DB = nil }, "needs the database its transactions run on"},
		{func(c *idemgrpc.Config) { c.Runner = idem.NewSQLRunner(db, nil) }, "both a DB and a Runner"},
		{func(c *idemgrpc.Config) {
			c.DB, c.Runner, c.TxOptions = nil, idem.NewSQLRunner(db, nil), &sql.TxOptions{}
		}, "TxOptions are database/sql's"},
		{func(c *idemgrpc.Config) { c.Scope = nil }, "idemgrpc.SingleTenant"},
		{func(c *idemgrpc.Config) { c.Mode = 7 }, "unknown Mode 7"},
		{func(c *idemgrpc.Config) { c.KeyField = "request-id" }, "not a protobuf field name"},
		{func(c *idemgrpc.Config) { c.Timeout = -time.Second }, "must not be negative"},
		{func(c *idemgrpc.Config) { c.Mode, c.Timeout = idemserve.ModeClaim, 11*time.Second }, "exceeds the Store's lease"},
		{func(c *idemgrpc.Config) { c.NoSideEffects = []string{"payments.v1.Payments.Get"} }, "not a full method name"},
		{func(c *idemgrpc.Config) { c.ReplayMetadata = []string{"grpc-status"} }, "gRPC's own"},
		{func(c *idemgrpc.Config) { c.ReplayMetadata = []string{"x y"} }, "only letters"},
	} {
		cfg := ok
		c.change(&cfg)
		if _, err := idemgrpc.New(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", cfg, err, c.want)
		}
	}
	if _, err := idemgrpc.New(ok); err != nil {
		t.Fatal(err)
	}
	claim := ok
	claim.Mode = idemserve.ModeClaim // Timeout defaults to the lease, 10 s
	if _, err := idemgrpc.New(claim); err != nil {
		t.Fatal(err)
	}
}
