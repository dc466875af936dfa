package jetstreamsub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/contrib/idemwatermill/jetstreamsub"
	"github.com/idemkit/idem/idemserve"
)

// The defaults agree: the middleware's default Timeout is below
// JetStream's default AckWait. A Timeout or a claim's lease that is not
// is refused, saying which.
func TestCheckTimeout(t *testing.T) {
	store, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	long, err := idem.New(idem.Postgres, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	durable := jetstream.ConsumerConfig{Durable: "orders"}
	if err := jetstreamsub.CheckTimeout(idemwatermill.Config{Store: store}, durable); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	if err := jetstreamsub.CheckTimeout(idemwatermill.Config{Store: store, Mode: idemserve.ModeClaim}, durable); err != nil {
		t.Fatalf("the defaults in ModeClaim: %v", err)
	}
	for _, c := range []struct {
		cfg      idemwatermill.Config
		consumer jetstream.ConsumerConfig
		want     string
	}{
		{idemwatermill.Config{Store: store, Timeout: 30 * time.Second}, durable, "Timeout, 30s, is not below"},
		{idemwatermill.Config{Store: store}, jetstream.ConsumerConfig{Durable: "orders", AckWait: 10 * time.Second}, "Timeout, 20s, is not below"},
		{idemwatermill.Config{Store: long, Mode: idemserve.ModeClaim, Timeout: 10 * time.Second}, durable, "lease, 1m0s, exceeds"},
	} {
		if err := jetstreamsub.CheckTimeout(c.cfg, c.consumer); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v against AckWait %v: %v, want %q", c.cfg.Timeout, c.consumer.AckWait, err, c.want)
		}
	}
}

// Setup refuses a consumer the middleware cannot rely on before it asks
// the server anything.
func TestSetupRefuses(t *testing.T) {
	stream := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders"}}
	for _, c := range []jetstream.ConsumerConfig{{}, {Durable: "orders", AckPolicy: jetstream.AckNonePolicy}, {Durable: "orders", AckPolicy: jetstream.AckAllPolicy}} {
		if _, err := jetstreamsub.Setup(context.Background(), nil, stream, c); err == nil {
			t.Errorf("Setup accepted %+v", c)
		}
	}
	if _, err := jetstreamsub.NewSubscriber(jetstreamsub.SubscriberConfig{URL: "nats://127.0.0.1:1"}); err == nil {
		t.Error("NewSubscriber accepted no Durable")
	}
}
