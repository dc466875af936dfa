package jetstreamsub_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/contrib/idemwatermill/jetstreamsub"
)

// The JetStream side of a consumer with an outbox, as code: the stream
// "orders" and its durable consumer, the stream "shipments" the
// forwarder publishes into, the check that the middleware's Timeout ends
// before AckWait, and the router on a subscriber whose Close is safe.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	// The stream the consumer reads, named after its topic, and the
	// durable consumer every process of it shares.
	consumer := jetstream.ConsumerConfig{Durable: "record-order", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxDeliver: 20, MaxAckPending: 256}
	if _, err := jetstreamsub.Setup(ctx, js, jetstream.StreamConfig{Name: "orders", Subjects: []string{"orders"},
		MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute}, consumer); err != nil {
		log.Fatal(err)
	}
	// The stream the forwarder publishes the handler's messages into.
	if _, err := jetstreamsub.SetupStream(ctx, js, jetstream.StreamConfig{Name: "shipments", Subjects: []string{"shipments"}}); err != nil {
		log.Fatal(err)
	}

	store, err := idem.New(idem.Postgres, idem.WithRetention(8*24*time.Hour)) // beyond the stream's MaxAge
	if err != nil {
		log.Fatal(err)
	}
	cfg := idemwatermill.Config{Store: store, DB: db,
		Outbox: idemwatermill.ForwarderOutbox(wsql.DefaultPostgreSQLSchema{}, "outbox", nil)}
	if err := jetstreamsub.CheckTimeout(cfg, consumer); err != nil {
		log.Fatal(err)
	}
	consume, err := idemwatermill.Middleware(cfg)
	if err != nil {
		log.Fatal(err)
	}
	sub, err := jetstreamsub.NewSubscriber(jetstreamsub.SubscriberConfig{URL: nats.DefaultURL, Durable: consumer.Durable, AckWait: consumer.AckWait})
	if err != nil {
		log.Fatal(err)
	}
	logger := watermill.NewSlogLogger(nil)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(consume)
	router.AddHandler("record-order", "orders", sub, "shipments", nil, func(msg *message.Message) ([]*message.Message, error) {
		tx := idemwatermill.TxFrom(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO orders (id, body) VALUES ($1, $2)", msg.UUID, msg.Payload); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})

	// The forwarder: from the outbox table to the "shipments" stream.
	outboxSub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{ConsumerGroup: "forwarder",
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true}, logger)
	if err != nil {
		log.Fatal(err)
	}
	natsPub, err := wjs.NewPublisher(wjs.PublisherConfig{URL: nats.DefaultURL, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	fwd, err := forwarder.NewForwarder(outboxSub, natsPub, logger, forwarder.Config{ForwarderTopic: "outbox"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
