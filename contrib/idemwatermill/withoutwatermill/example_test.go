package withoutwatermill_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/testdb"
)

// natsEnv names the NATS server the JetStream example runs against.
const natsEnv = "IDEM_TEST_NATS_URL"

// TestMain runs the examples when PostgreSQL and NATS with JetStream
// answer, as testdb.Main does for a database: without NATS it runs
// nothing and says how to start it, and fails under IDEM_TEST_REQUIRE=1.
func TestMain(m *testing.M) {
	url := os.Getenv(natsEnv)
	if url == "" {
		url = nats.DefaultURL
	}
	if err := pingJetStream(url); err != nil {
		fmt.Printf("withoutwatermill: not running these tests: there is no NATS with JetStream at %s (%v); start it with "+
			"`start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log`, or set %s\n", url, err, natsEnv)
		if testdb.Required {
			os.Exit(1)
		}
		os.Exit(0)
	}
	_ = os.Setenv(natsEnv, url)
	testdb.Main(m, testdb.Postgres)
}

func pingJetStream(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func suffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// A JetStream consumer on nats.go alone. The producer sets Nats-Msg-Id,
// its own id of the message: JetStream drops a duplicate within its
// duplicate window, and idem drops every other one (a producer's retry
// after the window, a redelivery after a lost ack) for as long as the
// Store keeps the record. The consumer applies each message in a
// transaction with idem.RunTx and Store.Do, keyed by that id, and acks
// only after the commit. Here the first ack of order-1 is lost (the
// consumer naks instead, as a crash between the commit and the ack
// would leave it): the redelivery is answered from the record, and its
// effect is not applied again.
func Example_jetStream() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	sfx := suffix()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_js_keys_"+sfx))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	orders := "example_js_orders_" + sfx
	if _, err := db.Exec("CREATE TABLE " + orders + " (id TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + orders + ", " + store.Table())

	nc, err := nats.Connect(os.Getenv(natsEnv))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	name := "EXAMPLE_ORDERS_" + sfx
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.MemoryStorage})
	if err != nil {
		log.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	for _, id := range []string{"order-1", "order-2"} {
		if _, err := js.Publish(ctx, name, []byte(`{"item":"book"}`), jetstream.WithMsgID(id)); err != nil {
			log.Fatal(err)
		}
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "orders", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}

	lost := false
	for handled, fetches := 0, 0; handled < 3 && fetches < 30; fetches++ {
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			log.Fatal(err)
		}
		for msg := range batch.Messages() {
			handled++
			key := msg.Headers().Get(nats.MsgIdHdr)
			if key == "" { // no producer id: the stream sequence, which dedupes redeliveries only
				md, err := msg.Metadata()
				if err != nil {
					log.Fatal(err)
				}
				key = fmt.Sprintf("%s-%d", md.Stream, md.Sequence.Stream)
			}
			// The Operation is what the key is bound to: the subject it came
			// from, so that one key on two subjects is refused, and
			// idem inspect shows where a record came from.
			req := idem.Request{Scope: "orders-consumer", Key: key, Operation: msg.Subject(), Fingerprint: idem.Fingerprint(msg.Data())}
			var res idem.Result
			err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				var err error
				res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
					_, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (id) VALUES ($1)", key)
					return idem.Response{StatusCode: 200}, err
				})
				return err
			})
			switch {
			case errors.Is(err, idem.ErrMismatch):
				_ = msg.Term() // the id was used for another message: never apply it
				continue
			case err != nil:
				_ = msg.Nak() // nothing was stored: redelivered, and applied then
				continue
			}
			fmt.Printf("%s: replayed %v\n", key, res.Replayed)
			if key == "order-1" && !lost {
				lost = true
				_ = msg.Nak() // the ack is lost after the commit
				continue
			}
			if err := msg.DoubleAck(ctx); err != nil {
				log.Fatal(err)
			}
		}
		if err := batch.Error(); err != nil {
			log.Fatal(err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + orders).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows:", n)
	// Output:
	// order-1: replayed false
	// order-2: replayed false
	// order-1: replayed true
	// rows: 2
}

// A Kafka consumer on franz-go (compiled, not run: no Kafka server runs
// here). Offsets are committed by hand, after the transaction that
// applies the records committed, and rebalances wait until then
// (BlockRebalanceOnPoll), so that a record is redelivered only when its
// commit may not have happened, and idem answers the redelivery from its
// record. The key is the producer's idempotency-key header; without one,
// the record's topic, partition and offset, which deduplicate
// redeliveries but not a producer's retry.
func Example_kafka() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("orders"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) { log.Printf("%s/%d: %v", topic, partition, err) })
		var applied []*kgo.Record
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed != nil {
				return // nothing past a failure is committed
			}
			key := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
			for _, h := range r.Headers {
				if h.Key == "idempotency-key" {
					key = string(h.Value)
				}
			}
			req := idem.Request{Scope: "orders-consumer", Key: key, Operation: r.Topic, Fingerprint: idem.Fingerprint(r.Value)}
			err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				_, err := store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
					_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, body) VALUES ($1, $2)", key, r.Value)
					return idem.Response{StatusCode: 200}, err
				})
				return err
			})
			if err != nil && !errors.Is(err, idem.ErrMismatch) { // a mismatch is never applied: skip it
				failed = fmt.Errorf("record %s: %w", key, err)
				return
			}
			applied = append(applied, r)
		})
		if err := cl.CommitRecords(ctx, applied...); err != nil {
			log.Printf("commit offsets: %v; the records are redelivered and answered from their records", err)
		}
		if failed != nil {
			// Consume again from the last committed offset: what committed
			// is answered from its record, what did not is applied.
			log.Fatalf("%v; restart the consumer", failed)
		}
		cl.AllowRebalance()
	}
}
