package idemwatermill_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// The examples run on PostgreSQL, with watermill-sql's own pub/sub as
// the broker, so that they need nothing else; a service would consume
// from NATS, RabbitMQ or Kafka in the same way. The DSN is the one
// idemtest/testdb finds (IDEM_TEST_POSTGRES_DSN).

// exampleDB opens the database and makes the examples' tables: idem's,
// example_watermill_orders, and watermill-sql's tables of each topic. drop
// removes them.
func exampleDB(topics ...string) (db *sql.DB, store *idem.Store, drop func()) {
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	suffix := randName("")
	store, err = idem.New(idem.Postgres, idem.WithTable("example_keys"+suffix))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tables := []string{store.Table(), "example_watermill_orders"}
	if _, err := db.Exec("CREATE TABLE example_watermill_orders (id TEXT NOT NULL, ref TEXT NOT NULL DEFAULT '')"); err != nil {
		log.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, topic := range topics {
		if err := sub.SubscribeInitialize(topic); err != nil {
			log.Fatal(err)
		}
		tables = append(tables, `"watermill_`+topic+`"`, `"watermill_offsets_`+topic+`"`)
	}
	return db, store, func() {
		for _, t := range tables {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
		}
		db.Close()
	}
}

// sqlPublisher is watermill-sql's publisher on db.
func sqlPublisher(db *sql.DB) message.Publisher {
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	return pub
}

// sqlSubscriber is a watermill-sql subscriber of consumer group on db.
func sqlSubscriber(db *sql.DB, group string) message.Subscriber {
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{ConsumerGroup: group, PollInterval: 20 * time.Millisecond,
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	return sub
}

// run runs router until done reports true, at most 30 s.
func run(router *message.Router, done func() bool) {
	go func() {
		if err := router.Run(context.Background()); err != nil {
			log.Fatal(err)
		}
	}()
	<-router.Running()
	for deadline := time.Now().Add(30 * time.Second); !done() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := router.Close(); err != nil {
		log.Fatal(err)
	}
}

// countRows counts the rows of query.
func countRows(db *sql.DB, query string, args ...any) int {
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}

// A consumer whose handler writes its rows through TxFrom: each message
// is applied once, its record committed with its rows, and acked after
// the commit. The producer sends order-1 twice, as a producer that
// retries after a timeout does: the second is acked from the first
// one's record, and the handler does not run for it.
func Example() {
	topic := randName("orders")
	db, store, drop := exampleDB(topic)
	defer drop()

	consume, err := idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: db})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(consume)
	pub := sqlPublisher(db)
	router.AddConsumerHandler("record-order", topic, sqlSubscriber(db, "orders"), func(msg *message.Message) error {
		tx := idemwatermill.TxFrom(msg.Context()) // never Commit or Rollback it
		_, err := tx.ExecContext(msg.Context(), "INSERT INTO example_watermill_orders (id) VALUES ($1)", msg.UUID)
		return err
	})

	for _, id := range []string{"order-1", "order-1", "order-2"} {
		if err := pub.Publish(topic, message.NewMessage(id, []byte(`{"item":"book"}`))); err != nil {
			log.Fatal(err)
		}
	}
	run(router, func() bool {
		return countRows(db, `SELECT COUNT(*) FROM "watermill_offsets_`+topic+`" WHERE offset_acked = 3`) == 1
	})
	for _, id := range []string{"order-1", "order-2"} {
		fmt.Printf("%s: %d row\n", id, countRows(db, "SELECT COUNT(*) FROM example_watermill_orders WHERE id = $1", id))
	}
	// Output:
	// order-1: 1 row
	// order-2: 1 row
}

// A handler that calls a payment provider runs in ModeClaim: under a
// claim committed before it starts, with no transaction open while it
// waits for the provider, to which it passes the claim's RelayKey as
// the provider's idempotency key. Its rows and the claim's completion
// commit in the transaction TxFrom begins.
func Example_claimMode() {
	topic := randName("payments")
	db, store, drop := exampleDB(topic)
	defer drop()

	consume, err := idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: db, Mode: idemserve.ModeClaim})
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	charges := map[string]string{} // the provider's: relay key → charge
	charge := func(ctx context.Context, key string) string {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		return charges[key]
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(consume)
	pub := sqlPublisher(db)
	router.AddConsumerHandler("charge", topic, sqlSubscriber(db, "payments"), func(msg *message.Message) error {
		ctx := msg.Context()
		ref := charge(ctx, idemwatermill.ClaimFrom(ctx).RelayKey()) // no transaction is open yet
		tx := idemwatermill.TxFrom(ctx)                             // begins it now
		if tx == nil {
			return fmt.Errorf("no transaction") // nacked; the claim is released
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO example_watermill_orders (id, ref) VALUES ($1, $2)", msg.UUID, ref)
		return err
	})

	for _, id := range []string{"order-7", "order-7"} {
		if err := pub.Publish(topic, message.NewMessage(id, []byte(`{"amount":1200}`))); err != nil {
			log.Fatal(err)
		}
	}
	run(router, func() bool {
		return countRows(db, `SELECT COUNT(*) FROM "watermill_offsets_`+topic+`" WHERE offset_acked = 2`) == 1
	})
	fmt.Println("charges:", len(charges))
	fmt.Println("rows:", countRows(db, "SELECT COUNT(*) FROM example_watermill_orders WHERE id = 'order-7' AND ref = 'ch_1'"))
	// Output:
	// charges: 1
	// rows: 1
}

// The messages a handler returns are written to the outbox, watermill-sql's
// table of the forwarder topic, in the handler's transaction
// (ForwarderOutbox), not published by the router; watermill's
// forwarder then publishes them to their topic. Here that is another
// watermill-sql topic, so that the example needs no broker; a service
// passes forwarder.NewForwarder its broker's publisher (NATS,
// RabbitMQ, Kafka). The redelivery of order-9 is acked from its record
// and publishes nothing again.
func Example_outbox() {
	orders, outbox, shipments := randName("orders"), randName("outbox"), randName("shipments")
	db, store, drop := exampleDB(orders, outbox, shipments)
	defer drop()

	consume, err := idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: db,
		Outbox: idemwatermill.ForwarderOutbox(wsql.DefaultPostgreSQLSchema{}, outbox, nil)})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(consume)
	pub := sqlPublisher(db)
	// The router's publisher is nil: the middleware writes the handler's
	// messages to the outbox, and the router has none left to publish.
	router.AddHandler("ship", orders, sqlSubscriber(db, "shipping"), shipments, nil, func(msg *message.Message) ([]*message.Message, error) {
		tx := idemwatermill.TxFrom(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO example_watermill_orders (id) VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("shipment-of-"+msg.UUID, []byte(`{"carrier":"post"}`))}, nil
	})

	// The forwarder reads the outbox and publishes to the destination.
	fwd, err := forwarder.NewForwarder(sqlSubscriber(db, "forwarder"), sqlPublisher(db), watermill.NopLogger{}, forwarder.Config{ForwarderTopic: outbox})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := fwd.Run(context.Background()); err != nil {
			log.Fatal(err)
		}
	}()
	defer fwd.Close()

	for _, id := range []string{"order-9", "order-9"} {
		if err := pub.Publish(orders, message.NewMessage(id, []byte(`{"item":"lamp"}`))); err != nil {
			log.Fatal(err)
		}
	}
	run(router, func() bool {
		return countRows(db, `SELECT COUNT(*) FROM "watermill_offsets_`+orders+`" WHERE offset_acked = 2`) == 1 &&
			countRows(db, `SELECT COUNT(*) FROM "watermill_`+shipments+`"`) > 0
	})
	time.Sleep(100 * time.Millisecond) // a second shipment, if there were one, would be forwarded by now
	rows, err := db.Query(`SELECT uuid FROM "watermill_` + shipments + `"`)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var uuid string
		if err := rows.Scan(&uuid); err != nil {
			log.Fatal(err)
		}
		fmt.Println("published:", uuid)
	}
	// Output:
	// published: shipment-of-order-9
}
