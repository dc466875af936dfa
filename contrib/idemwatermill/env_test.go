package idemwatermill_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/contrib/idemwatermill/jetstreamsub"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/idemserve"
	"github.com/idemkit/idem/idemtest/testdb"
)

// consumerEnv, set to a spec in JSON, makes the test binary run as a
// consumer process (runChild) instead of running tests: the fault tests
// start it so that they can kill a consumer outright.
const consumerEnv = "IDEMWATERMILL_CONSUMER"

func TestMain(m *testing.M) {
	if s := os.Getenv(consumerEnv); s != "" {
		os.Exit(runChild(s))
	}
	// The tests spend their time waiting for brokers' timers (ack waits,
	// redeliveries), not on the CPU: run more of them at once than the
	// default of one per core, unless -parallel says otherwise.
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "6")
	}
	testdb.Main(m, testdb.Postgres)
}

// broker is a message broker the tests reach, found as testdb finds a
// database: its URL from Env, else Local if it answers.
type broker struct {
	Name, Env, Local string
	// Start is how to start it on a development machine or in CI.
	Start string
	ping  func(url string) error

	once   sync.Once
	url    string
	reason string
}

var (
	natsBroker = &broker{Name: "NATS with JetStream", Env: "IDEM_TEST_NATS_URL", Local: "nats://127.0.0.1:4222",
		Start: "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log",
		ping:  pingNATS}
	rabbitBroker = &broker{Name: "RabbitMQ", Env: "IDEM_TEST_AMQP_URL", Local: "amqp://guest:guest@127.0.0.1:5672/",
		Start: "rabbitmq-server -detached", ping: pingAMQP}
)

// URL returns the broker's URL, or ends t: skipped when there is none,
// failed under IDEM_TEST_REQUIRE=1 or when the URL set in Env does not
// answer.
func (b *broker) URL(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		url, fromEnv := os.Getenv(b.Env), true
		if url == "" {
			url, fromEnv = b.Local, false
		}
		if err := b.ping(url); err != nil {
			b.reason = fmt.Sprintf("there is no %s: nothing answers at %s (%v); start it with `%s`, or set %s to its URL", b.Name, url, err, b.Start, b.Env)
			if fromEnv {
				b.reason = fmt.Sprintf("%s=%s does not answer: %v", b.Env, url, err)
			}
			return
		}
		b.url = url
	})
	switch {
	case b.url != "":
		return b.url
	case os.Getenv(b.Env) != "":
		t.Fatal(b.reason) // a URL set that does not answer must not pass for a broker that is not there
	case testdb.Required:
		t.Fatalf("IDEM_TEST_REQUIRE=1 and %s", b.reason)
	}
	t.Skip(b.reason)
	return ""
}

func pingNATS(url string) error {
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
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream is not enabled (start nats-server with -js): %w", err)
	}
	return nil
}

func pingAMQP(url string) error {
	c, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return c.Close()
}

// target is a database, through one driver: database/sql, or pgx
// natively (the middleware on an idempgx Runner, the handler's
// transaction a pgx.Tx).
type target struct {
	Name    string
	server  *testdb.Server
	driver  string
	dialect idem.Dialect
	native  bool
}

var (
	postgres    = target{"postgres", testdb.Postgres, "pgx", idem.Postgres, false}
	postgresPgx = target{"postgres-pgx", testdb.Postgres, "pgx", idem.Postgres, true}
	mariadb     = target{"mariadb", testdb.MariaDB, "mysql", idem.MariaDB, false}
	targets     = map[string]target{postgres.Name: postgres, postgresPgx.Name: postgresPgx, mariadb.Name: mariadb}
)

// q writes query, whose parameters are $1, $2, ..., for the target's
// placeholders.
func (tg target) q(query string) string {
	if tg.dialect == idem.Postgres {
		return query
	}
	for i := 9; i >= 1; i-- {
		query = strings.ReplaceAll(query, fmt.Sprintf("$%d", i), "?")
	}
	return query
}

// env is one test's database: the target, its DSN and a database/sql
// pool of the test's for setting up and checking.
type env struct {
	t  *testing.T
	tg target
	// dsn is the server's; db the test's own pool on it.
	dsn string
	db  *sql.DB
}

func newEnv(t *testing.T, tg target) *env {
	t.Helper()
	e := &env{t: t, tg: tg, dsn: tg.server.DSN(t)}
	db, err := sql.Open(tg.driver, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	e.db = db
	return e
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// store makes idem's table, dropped when the test ends, and a Store on
// it.
func (e *env) store(opts ...idem.Option) *idem.Store {
	e.t.Helper()
	table := randName("idemwm")
	s, err := idem.New(e.tg.dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), e.db); err != nil {
		e.t.Fatal(err)
	}
	e.dropLater(table)
	return s
}

// business makes a table of business rows, one per message applied,
// dropped when the test ends. It has no unique key, so that a message
// applied twice shows as two rows.
func (e *env) business() string {
	e.t.Helper()
	table := randName("applied")
	if _, err := e.db.Exec(fmt.Sprintf("CREATE TABLE %s (id VARCHAR(64) NOT NULL, handler VARCHAR(64) NOT NULL)", table)); err != nil {
		e.t.Fatal(err)
	}
	e.dropLater(table)
	return table
}

func (e *env) dropLater(tables ...string) {
	e.t.Cleanup(func() {
		for _, table := range tables {
			if _, err := e.db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
				e.t.Errorf("drop %s: %v", table, err)
			}
		}
	})
}

// applied counts the business rows of each message id.
func (e *env) applied(biz string) map[string]int {
	e.t.Helper()
	rows, err := e.db.Query(fmt.Sprintf("SELECT id, COUNT(*) FROM %s GROUP BY id", biz))
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	n := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			e.t.Fatal(err)
		}
		n[id] = c
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// exactlyOnce reports every id of ids whose effect is not applied exactly
// once in biz, and every row of an id not in ids.
func (e *env) exactlyOnce(biz string, ids []string) error {
	e.t.Helper()
	got := e.applied(biz)
	var errs []error
	for _, id := range ids {
		if got[id] != 1 {
			errs = append(errs, fmt.Errorf("message %s applied %d times, want exactly once", id, got[id]))
		}
		delete(got, id)
	}
	for id, n := range got {
		errs = append(errs, fmt.Errorf("message %s, never published, applied %d times", id, n))
	}
	return errors.Join(errs...)
}

// ids are n message ids of a test.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// payload is the message body of id: JSON, as watermill-sql's tables
// store payloads in JSON columns.
type payload struct {
	ID   string `json:"id"`
	Note string `json:"note,omitempty"`
}

func newMessage(id string) *message.Message {
	b, _ := json.Marshal(payload{ID: id})
	return message.NewMessage(id, b)
}

func idOf(msg *message.Message) string {
	var p payload
	_ = json.Unmarshal(msg.Payload, &p)
	return p.ID
}

// logTo is a Logger that writes to t's log, shown only when t fails: the
// tests provoke errors, which the router logs. What is logged once t has
// ended is dropped.
func logTo(t *testing.T) *slog.Logger {
	w := &testLog{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testLog struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testLog) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

// wmLogger is a watermill logger of what is worth a look (its errors
// and info; not the debug and trace of every message).
func wmLogger(l *slog.Logger) watermill.LoggerAdapter {
	return watermill.NewSlogLoggerWithLevelMapping(l, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
}

// spec is what a consumer runs: the transport and its topic, the
// database, the middleware's mode, and the child process's fault. The
// fault tests pass it to a child process in JSON (consumerEnv).
type spec struct {
	Transport string        // "nats", "amqp" or "sql" (watermill-sql's pub/sub on the database)
	URL       string        // the broker's; "" for sql
	Topic     string        // the stream and its durable consumer, the queue, or watermill-sql's tables
	AckWait   time.Duration // NATS's AckWait, watermill-sql's AckDeadline
	Target    string        // a key of targets
	DSN       string
	Table     string // idem's
	Biz       string // the business rows
	Mode      idemserve.Mode
	Handler   string
	// CrashAfter, in a child, kills it with SIGKILL right after the
	// middleware returned for the CrashAfter-th message it committed,
	// before the router acks it.
	CrashAfter int
}

func (s spec) target() target { return targets[s.Target] }

// transports are the names of the transports the tests run on, with the
// broker each needs (nil: the database).
var transports = []struct {
	name   string
	broker *broker
}{{"nats", natsBroker}, {"amqp", rabbitBroker}, {"sql", nil}}

// newSpec is a spec for a test on transport and e's database, with a
// topic of its own on the broker (a stream with a durable consumer, a
// queue, watermill-sql's tables), removed when the test ends, and the
// business rows' table.
func (e *env) newSpec(transport string, ackWait time.Duration) spec {
	e.t.Helper()
	s := spec{Transport: transport, Topic: randName("t"), AckWait: ackWait, Target: e.tg.Name, DSN: e.dsn, Biz: e.business(), Handler: "apply"}
	switch transport {
	case "nats":
		s.URL = natsBroker.URL(e.t)
		e.natsTopic(s)
	case "amqp":
		s.URL = rabbitBroker.URL(e.t)
		e.amqpQueue(s)
	case "sql":
		e.sqlTopic(s.Topic)
	default:
		e.t.Fatalf("unknown transport %q", transport)
	}
	return s
}

// natsTopic makes s's stream and its durable consumer, deleted when the
// test ends.
func (e *env) natsTopic(s spec) {
	e.t.Helper()
	js := e.jetStream(s.URL)
	ctx := context.Background()
	e.t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), s.Topic); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			e.t.Errorf("delete stream %s: %v", s.Topic, err)
		}
	})
	if _, err := jetstreamsub.Setup(ctx, js, jetstream.StreamConfig{Name: s.Topic, Subjects: []string{s.Topic}, Storage: jetstream.MemoryStorage},
		jetstream.ConsumerConfig{Durable: s.Topic, AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.AckWait, MaxDeliver: -1, MaxAckPending: 256}); err != nil {
		e.t.Fatal(err)
	}
}

// jetStream connects to NATS for the test.
func (e *env) jetStream(url string) jetstream.JetStream {
	e.t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	return js
}

// amqpQueue declares s's queue, as watermill-amqp's durable queue
// configuration declares it, deleted when the test ends.
func (e *env) amqpQueue(s spec) {
	e.t.Helper()
	ch := e.amqpChannel(s.URL)
	if _, err := ch.QueueDeclare(s.Topic, true, false, false, false, nil); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if _, err := ch.QueueDelete(s.Topic, false, false, false); err != nil {
			e.t.Errorf("delete queue %s: %v", s.Topic, err)
		}
	})
}

func (e *env) amqpChannel(url string) *amqp091.Channel {
	e.t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// sqlSchema is watermill-sql's schema and offsets adapter for the
// target's database.
func (tg target) sqlSchema() (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if tg.dialect == idem.Postgres {
		return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 10}, wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	return wsql.DefaultMySQLSchema{SubscribeBatchSize: 10}, wsql.DefaultMySQLOffsetsAdapter{}
}

// sqlTopic makes watermill-sql's tables of topic, dropped when the test
// ends.
func (e *env) sqlTopic(topic string) {
	e.t.Helper()
	schema, offsets := e.tg.sqlSchema()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(e.db), wsql.SubscriberConfig{SchemaAdapter: schema, OffsetsAdapter: offsets}, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		e.t.Fatal(err)
	}
	_ = sub.Close()
	e.dropLater("watermill_"+topic, "watermill_offsets_"+topic)
}

// publisher publishes to s's topic for the test.
func (e *env) publisher(s spec) message.Publisher {
	e.t.Helper()
	var pub message.Publisher
	var err error
	switch s.Transport {
	case "nats":
		pub, err = wjs.NewPublisher(wjs.PublisherConfig{URL: s.URL, Logger: watermill.NopLogger{}})
	case "amqp":
		pub, err = wamqp.NewPublisher(wamqp.NewDurableQueueConfig(s.URL), watermill.NopLogger{})
	case "sql":
		schema, _ := e.tg.sqlSchema()
		pub, err = wsql.NewPublisher(wsql.BeginnerFromStdSQL(e.db), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { pub.Close() })
	return pub
}

// publish publishes each id to s's topic, in order.
func (e *env) publish(pub message.Publisher, s spec, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if err := pub.Publish(s.Topic, newMessage(id)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// pending is how many of s's messages the broker has not had acked
// (NATS, watermill-sql), or holds ready to deliver (RabbitMQ: its
// unacked ones the tracking subscriber counts).
func (e *env) pending(s spec) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch s.Transport {
	case "nats":
		nc, err := nats.Connect(s.URL)
		if err != nil {
			return 0, err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return 0, err
		}
		c, err := js.Consumer(ctx, s.Topic, s.Topic)
		if err != nil {
			return 0, err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return 0, err
		}
		return int(info.NumPending) + info.NumAckPending, nil
	case "amqp":
		c, err := amqp091.Dial(s.URL)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return 0, err
		}
		q, err := ch.QueueDeclarePassive(s.Topic, true, false, false, false, nil)
		return q.Messages, err
	}
	var n int
	err := e.db.QueryRowContext(ctx, e.sqlPending(s.Topic), consumerGroup).Scan(&n)
	return n, err
}

// sqlPending is a query of how many messages of watermill-sql's topic
// a consumer group, the query's parameter, has not acked.
func (e *env) sqlPending(topic string) string {
	if e.tg.dialect == idem.Postgres {
		return fmt.Sprintf(`SELECT COUNT(*) FROM "watermill_%[1]s" m WHERE NOT EXISTS (SELECT 1 FROM "watermill_offsets_%[1]s" o
			WHERE o.consumer_group = $1 AND (m.transaction_id < o.last_processed_transaction_id
				OR m.transaction_id = o.last_processed_transaction_id AND m."offset" <= o.offset_acked))`, topic)
	}
	return fmt.Sprintf("SELECT COUNT(*) FROM `watermill_%[1]s` WHERE `offset` > COALESCE((SELECT offset_acked FROM `watermill_offsets_%[1]s` WHERE consumer_group = ?), 0)", topic)
}

// consumerGroup is the watermill-sql consumer group of the tests'
// consumers.
const consumerGroup = "consumers"

// subscriber subscribes to s's topic. For NATS it binds to the stream's
// durable consumer, which every consumer of the test shares; for
// RabbitMQ it consumes the queue; for watermill-sql it is one of the
// consumer group.
func (s spec) subscriber(logger watermill.LoggerAdapter) (message.Subscriber, error) {
	switch s.Transport {
	case "nats":
		return s.natsSubscriber(s.Topic, logger)
	case "amqp":
		return wamqp.NewSubscriber(wamqp.NewDurableQueueConfig(s.URL), logger)
	}
	tg := s.target()
	db, err := sql.Open(tg.driver, s.DSN)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	schema, offsets := tg.sqlSchema()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{ConsumerGroup: consumerGroup, AckDeadline: &s.AckWait,
		PollInterval: 20 * time.Millisecond, ResendInterval: 20 * time.Millisecond, RetryInterval: 50 * time.Millisecond,
		SchemaAdapter: schema, OffsetsAdapter: offsets}, logger)
	if err != nil {
		db.Close()
		return nil, err
	}
	return closing{sub, db}, nil
}

// natsSubscriber subscribes to s's stream through its durable consumer
// name, with the subscriber of package jetstreamsub, whose Close is
// safe.
func (s spec) natsSubscriber(name string, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	return jetstreamsub.NewSubscriber(jetstreamsub.SubscriberConfig{URL: s.URL, Durable: name, AckWait: s.AckWait, PullMaxMessages: 8, Logger: logger})
}

// closing is a subscriber that closes a pool of its own after itself.
type closing struct {
	message.Subscriber
	db io.Closer
}

func (c closing) Close() error { return errors.Join(c.Subscriber.Close(), c.db.Close()) }

// pool is the database pool a consumer's middleware runs on.
type pool struct {
	tg  target
	db  *sql.DB
	pgx *pgxpool.Pool
}

func openPool(tg target, dsn string, conns int) (*pool, error) {
	if tg.native {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(conns)
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, err
		}
		return &pool{tg: tg, pgx: p}, nil
	}
	db, err := sql.Open(tg.driver, dsn)
	if err != nil {
		return nil, err
	}
	// Every connection stays open for the next transaction: with
	// database/sql's default of 2 idle ones, a connection given back
	// while more are open is closed, and PostgreSQL forks a backend for
	// each new one, which is most of what a busy test would measure.
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return &pool{tg: tg, db: db}, nil
}

func (p *pool) close() {
	if p.pgx != nil {
		p.pgx.Close()
		return
	}
	_ = p.db.Close()
}

// config is the middleware's Config on p, with its DB or its Runner.
func (p *pool) config(store *idem.Store, mode idemserve.Mode) idemwatermill.Config {
	cfg := idemwatermill.Config{Store: store, Mode: mode}
	if p.pgx != nil {
		cfg.Runner = idempgx.New(p.pgx, pgx.TxOptions{})
	} else {
		cfg.DB = p.db
	}
	return cfg
}

// errNoTx is the handler's error when it has no transaction.
var errNoTx = errors.New("no transaction")

// exec runs query ($1, $2, ... parameters) in the transaction of the
// handler whose context is ctx, through its driver.
func (tg target) exec(ctx context.Context, query string, args ...any) error {
	if tg.native {
		tx := idempgx.TxFrom(ctx)
		if tx == nil {
			return errNoTx
		}
		_, err := tx.Exec(ctx, query, args...)
		return err
	}
	tx := idemwatermill.TxFrom(ctx)
	if tx == nil {
		return errNoTx
	}
	_, err := tx.ExecContext(ctx, tg.q(query), args...)
	return err
}

// sessionID is the database session of the transaction of the handler
// whose context is ctx.
func (tg target) sessionID(ctx context.Context) (int64, error) {
	var id int64
	q := "SELECT pg_backend_pid()"
	if tg.dialect != idem.Postgres {
		q = "SELECT CONNECTION_ID()"
	}
	if tg.native {
		tx := idempgx.TxFrom(ctx)
		if tx == nil {
			return 0, errNoTx
		}
		return id, tx.QueryRow(ctx, q).Scan(&id)
	}
	tx := idemwatermill.TxFrom(ctx)
	if tx == nil {
		return 0, errNoTx
	}
	return id, tx.QueryRowContext(ctx, q).Scan(&id)
}

// kill ends the database session id, as a crash of the server's side of
// the connection would.
func (e *env) kill(id int64) error {
	var err error
	if e.tg.dialect == idem.Postgres {
		_, err = e.db.Exec("SELECT pg_terminate_backend($1)", id)
	} else {
		_, err = e.db.Exec(fmt.Sprintf("KILL %d", id))
	}
	return err
}
