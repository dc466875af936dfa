package idemwatermill_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// countingPublisher counts what is published through it: the router's
// publisher, which must publish nothing of a handler behind the
// middleware.
type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(string, ...*message.Message) error {
	p.n.Add(1)
	return errors.New("the router published a handler's messages outside its transaction")
}

func (p *countingPublisher) Close() error { return nil }

// The messages a handler returns and those it publishes through
// PublisherFrom are written to the outbox in its transaction, and
// watermill's forwarder publishes them to NATS. A delivery that fails
// after publishing leaves nothing in the outbox; a redelivery of a
// message that committed publishes nothing again; the router publishes
// nothing itself. The record's response lists the UUIDs published.
func TestOutboxAndForwarder(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		in := e.newSpec("nats", 30*time.Second)
		out := e.newSpec("nats", 30*time.Second).Topic
		audit := e.newSpec("nats", 30*time.Second).Topic
		outbox := randName("outbox")
		e.sqlTopic(outbox)
		schema, offsets := e.tg.sqlSchema()
		store := e.store()
		want := ids("out", 6)
		failOnce := want[2]
		var failed atomic.Bool
		mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
			cfg.Outbox = idemwatermill.ForwarderOutbox(schema, outbox, nil)
		})
		app := newApp(in)
		routerPub := &countingPublisher{}
		tr := &tracker{Subscriber: e.subscriber(in)}
		runRouter(t, func(r *message.Router) {
			r.AddMiddleware(mw)
			r.AddHandler(in.Handler, in.Topic, tr, out, routerPub, func(msg *message.Message) ([]*message.Message, error) {
				if err := app.handle(msg); err != nil {
					return nil, err
				}
				pub, err := idemwatermill.PublisherFrom(msg.Context())
				if err != nil {
					return nil, err
				}
				id := idOf(msg)
				if err := pub.Publish(audit, newMessage("audit-"+id)); err != nil {
					return nil, err
				}
				if id == failOnce && !failed.Swap(true) {
					return nil, errors.New("fails after publishing: its messages roll back")
				}
				return []*message.Message{newMessage("shipped-" + id)}, nil
			})
		})

		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(e.db), wsql.SubscriberConfig{ConsumerGroup: "forwarder",
			PollInterval: 20 * time.Millisecond, SchemaAdapter: schema, OffsetsAdapter: offsets}, nil)
		if err != nil {
			t.Fatal(err)
		}
		natsPub, err := wjs.NewPublisher(wjs.PublisherConfig{URL: in.URL, Logger: watermill.NopLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		fwd, err := forwarder.NewForwarder(sub, natsPub, wmLogger(logTo(t)), forwarder.Config{ForwarderTopic: outbox, CloseTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- fwd.Run(context.Background()) }()
		t.Cleanup(func() {
			if err := fwd.Close(); err != nil {
				t.Error(err)
			}
			if err := <-done; err != nil {
				t.Error(err)
			}
			natsPub.Close()
		})

		pub := e.publisher(in)
		e.publish(pub, in, want...)
		e.publish(pub, in, want...) // redeliveries: acked from their records, publishing nothing
		eventually(t, "every message forwarded", func() bool {
			n, err := e.pending(in)
			return err == nil && n == 0 && tr.outstanding.Load() == 0 &&
				len(e.streamMessages(in.URL, out)) >= len(want) && len(e.streamMessages(in.URL, audit)) >= len(want)
		})
		eventually(t, "the outbox forwarded", func() bool {
			var n int
			err := e.db.QueryRow(e.sqlPending(outbox), "forwarder").Scan(&n)
			return err == nil && n == 0
		})
		if err := e.exactlyOnce(in.Biz, want); err != nil {
			t.Fatal(err)
		}
		if n := routerPub.n.Load(); n != 0 {
			t.Fatalf("the router published %d times", n)
		}
		for topic, prefix := range map[string]string{out: "shipped-", audit: "audit-"} {
			var got []string
			for _, m := range e.streamMessages(in.URL, topic) {
				got = append(got, m.Header.Get(wnats.WatermillUUIDHdr))
			}
			slices.Sort(got)
			var exp []string
			for _, id := range want {
				exp = append(exp, prefix+id)
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("%s topic: %q, want each of %q once", prefix, got, exp)
			}
		}
		for _, id := range want {
			rec, err := store.Inspect(context.Background(), e.db, in.Handler, id)
			if err != nil {
				t.Fatal(err)
			}
			if rec == nil || rec.Status != idem.StatusCompleted || rec.Response.StatusCode != 200 ||
				string(rec.Response.Body) != "audit-"+id+"\nshipped-"+id {
				t.Fatalf("the record of %s: %+v, want status 200 and the UUIDs published", id, rec)
			}
		}
	})
}
