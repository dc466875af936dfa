package idemwatermill_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// TestThroughput measures messages per second consumed from NATS
// JetStream through the middleware, beside the same handler in a bare
// transaction that writes its own inbox row (the hand-written floor:
// INSERT ... ON CONFLICT DO NOTHING, INSERT IGNORE) and beside
// watermill's in-memory Deduplicator (which keeps nothing across
// processes or restarts), on PostgreSQL and MariaDB. It runs only with
// IDEM_BENCH=1 and asserts nothing about time: it logs each round and
// the medians, and the ratio of the middleware's to the floor's.
// IDEM_BENCH_ROUNDS (default 5) rounds alternate the three, each
// consuming IDEM_BENCH_MESSAGES (default 10000) messages published
// beforehand, with IDEM_BENCH_WORKERS (default 8) subscriptions of one
// durable consumer.
//
//	IDEM_BENCH=1 go test -run TestThroughput -v -timeout 30m .
func TestThroughput(t *testing.T) {
	if os.Getenv("IDEM_BENCH") != "1" {
		t.Skip("set IDEM_BENCH=1 to measure throughput")
	}
	rounds, messages, workers := benchEnv(t, "IDEM_BENCH_ROUNDS", 5), benchEnv(t, "IDEM_BENCH_MESSAGES", 10000), benchEnv(t, "IDEM_BENCH_WORKERS", 8)
	for _, tg := range []target{postgres, mariadb} {
		t.Run(tg.Name, func(t *testing.T) {
			e := newEnv(t, tg)
			b := &bench{e: e, store: e.store(), biz: e.business(), inbox: e.inbox(), messages: messages, workers: workers}
			p, err := openPool(tg, e.dsn, 2*workers)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.close)
			b.pool = p
			variants := []string{"idemwatermill", "floor", "deduplicator"}
			rates := map[string][]float64{}
			for r := range rounds {
				order := slices.Clone(variants)
				for i := 0; i < r%len(order); i++ { // rotate, so that no variant always runs first
					order = append(order[1:], order[0])
				}
				for _, v := range order {
					rate := b.round(t, v, fmt.Sprintf("r%d", r))
					rates[v] = append(rates[v], rate)
					t.Logf("round %d %-14s %8.0f msg/s", r, v, rate)
				}
			}
			med := map[string]float64{}
			for _, v := range variants {
				med[v] = median(rates[v])
			}
			// The ratio of each round's runs, side by side, then the median:
			// steadier than the medians' ratio on a machine whose load moves.
			var ratios []float64
			for r := range rounds {
				ratios = append(ratios, rates["idemwatermill"][r]/rates["floor"][r])
			}
			t.Logf("%s, %d messages a round, %d subscriptions, median of %d rounds: idemwatermill %.0f msg/s, floor %.0f msg/s, deduplicator %.0f msg/s; "+
				"idemwatermill/floor %.3f (per round: median %.3f, %.3f to %.3f)",
				tg.Name, messages, workers, rounds, med["idemwatermill"], med["floor"], med["deduplicator"],
				med["idemwatermill"]/med["floor"], median(ratios), slices.Min(ratios), slices.Max(ratios))
		})
	}
}

func benchEnv(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q is not a positive number", name, s)
	}
	return n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// inbox makes the floor's inbox table, dropped when the test ends.
func (e *env) inbox() string {
	e.t.Helper()
	table := randName("inbox")
	if _, err := e.db.Exec(fmt.Sprintf("CREATE TABLE %s (scope VARCHAR(255) NOT NULL, id VARCHAR(255) NOT NULL, PRIMARY KEY (scope, id))", table)); err != nil {
		e.t.Fatal(err)
	}
	e.dropLater(table)
	return table
}

type bench struct {
	e                 *env
	store             *idem.Store
	pool              *pool
	biz, inbox        string
	messages, workers int
}

// round publishes b.messages messages to a new stream, then consumes
// them with variant's handler, and returns the messages per second.
func (b *bench) round(t *testing.T, variant, round string) float64 {
	s := b.e.newSpec("nats", 30*time.Second)
	js := b.e.jetStream(s.URL)
	ctx := context.Background()
	if _, err := js.UpdateConsumer(ctx, s.Topic, jetstream.ConsumerConfig{Durable: s.Topic, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxDeliver: -1, MaxAckPending: 4096}); err != nil {
		t.Fatal(err)
	}
	pub, err := wjs.NewPublisher(wjs.PublisherConfig{URL: s.URL, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range b.messages {
		m := newMessage(fmt.Sprintf("%s-%s-%d", variant, round, i))
		m.UUID = watermill.NewUUID() // random, as producers' are, so that keys spread over the index
		if err := pub.Publish(s.Topic, m); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()

	// The clock runs from the first message handled to the last, without
	// the router's start.
	var (
		done      atomic.Int64
		first     atomic.Int64 // UnixNano
		finished  = make(chan struct{})
		firstOnce sync.Once
	)
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			firstOnce.Do(func() { first.Store(time.Now().UnixNano()) })
			out, err := h(msg)
			if err == nil && done.Add(1) == int64(b.messages) {
				close(finished)
			}
			return out, err
		}
	}
	var mw message.HandlerMiddleware
	handler := b.bare
	switch variant {
	case "idemwatermill":
		cfg := b.pool.config(b.store, idemserve.ModeTransaction)
		cfg.Scope = "bench"
		if mw, err = idemwatermill.Middleware(cfg); err != nil {
			t.Fatal(err)
		}
		handler = func(msg *message.Message) error {
			return b.e.tg.exec(msg.Context(), "INSERT INTO "+b.biz+" (id, handler) VALUES ($1, $2)", idOf(msg), "bench")
		}
	case "floor":
		handler = b.floor
	case "deduplicator":
		mw = (&middleware.Deduplicator{}).Middleware
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(count)
	if mw != nil {
		router.AddMiddleware(mw)
	}
	for w := range b.workers {
		sub, err := s.subscriber(watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddConsumerHandler(fmt.Sprintf("w%d", w), s.Topic, sub, handler)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- router.Run(ctx) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s: %d of %d messages after 5 minutes", variant, done.Load(), b.messages)
	}
	elapsed := time.Since(time.Unix(0, first.Load()))
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	return float64(b.messages) / elapsed.Seconds()
}

// floor is the hand-written inbox: in a transaction of its own, the
// message's inbox row, and the business row only if the inbox row is
// new.
func (b *bench) floor(msg *message.Message) error {
	ctx := msg.Context()
	insert := "INSERT INTO " + b.inbox + " (scope, id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
	if b.e.tg.dialect != idem.Postgres {
		insert = "INSERT IGNORE INTO " + b.inbox + " (scope, id) VALUES (?, ?)"
	}
	return b.inTx(ctx, func(exec func(q string, args ...any) (int64, error)) error {
		n, err := exec(insert, "bench", msg.UUID)
		if err != nil || n == 0 {
			return err
		}
		_, err = exec(b.e.tg.q("INSERT INTO "+b.biz+" (id, handler) VALUES ($1, $2)"), idOf(msg), "bench")
		return err
	})
}

// bare is the business row alone, in a transaction of its own, behind
// the Deduplicator.
func (b *bench) bare(msg *message.Message) error {
	return b.inTx(msg.Context(), func(exec func(q string, args ...any) (int64, error)) error {
		_, err := exec(b.e.tg.q("INSERT INTO "+b.biz+" (id, handler) VALUES ($1, $2)"), idOf(msg), "bench")
		return err
	})
}

// inTx runs fn in a transaction on the bench's pool, retried as the
// middleware retries its own.
func (b *bench) inTx(ctx context.Context, fn func(exec func(q string, args ...any) (int64, error)) error) error {
	return idem.RunTx(ctx, b.pool.db, nil, func(tx *sql.Tx) error {
		return fn(func(q string, args ...any) (int64, error) {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		})
	})
}
