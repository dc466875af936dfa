package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// fault is one way a consumer fails. Each runs on every transport and
// database, and ends by checking that every published message's effect
// was applied exactly once, none lost.
type fault struct {
	name string
	// only, when set, names the transports the fault runs on.
	only []string
	// modes are the middleware's modes it runs in; nil: ModeTransaction.
	modes []idemserve.Mode
	run   func(t *testing.T, f *faultEnv)
}

// faultEnv is a fault test's database, topic, Store and messages.
type faultEnv struct {
	*env
	s     spec
	store *idem.Store
	ids   []string
	// soak multiplies the messages of the test and the time it waits for
	// them: IDEM_SOAK, default 1.
	soak int
}

// messages are n ids of prefix, times the soak factor.
func (f *faultEnv) messages(prefix string, n int) []string { return ids(prefix, n*f.soak) }

// patience is how long the test waits for its messages to settle.
func (f *faultEnv) patience() time.Duration { return time.Duration(f.soak) * 45 * time.Second }

// ackWait is the NATS ack wait and watermill-sql ack deadline of the
// fault tests: short, so that a lost ack is redelivered soon.
const ackWait = 1500 * time.Millisecond

var faults = []fault{
	{name: "killed-after-commit-before-ack", modes: []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim}, run: killedAfterCommit},
	{name: "ack-lost", run: ackLost},
	{name: "ack-deadline-expires-while-handler-runs", only: []string{"nats", "sql"}, run: deadlineExpires},
	{name: "handler-fails-twice", modes: []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim}, run: failsTwice},
	{name: "published-three-times", run: publishedThrice},
	{name: "four-processes-duplicate-storm", run: storm},
	{name: "connection-killed-in-handler", modes: []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim}, run: connectionKilled},
}

// TestFaults runs every fault on every transport (NATS JetStream,
// RabbitMQ, watermill-sql's pub/sub) and database (PostgreSQL through
// database/sql, and through pgx on NATS; MariaDB). IDEM_SOAK=N makes a
// soak of it: N times the messages in each test.
func TestFaults(t *testing.T) {
	t.Parallel()
	soak := 1
	if v := os.Getenv("IDEM_SOAK"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IDEM_SOAK=%q is not a positive number", v)
		}
		soak = n
	}
	for _, tr := range transports {
		tgs := []target{postgres, mariadb}
		if tr.name == "nats" {
			tgs = append(tgs, postgresPgx)
		}
		for _, tg := range tgs {
			for _, f := range faults {
				if f.only != nil && !slices.Contains(f.only, tr.name) {
					continue
				}
				modes := f.modes
				if modes == nil {
					modes = []idemserve.Mode{idemserve.ModeTransaction}
				}
				for _, mode := range modes {
					t.Run(fmt.Sprintf("%s/%s/%s/%s", tr.name, tg.Name, f.name, modeName(mode)), func(t *testing.T) {
						t.Parallel()
						e := newEnv(t, tg)
						fe := &faultEnv{env: e, s: e.newSpec(tr.name, ackWait), store: e.store(), soak: soak}
						fe.s.Table, fe.s.Mode = fe.store.Table(), mode
						f.run(t, fe)
					})
				}
			}
		}
	}
}

// check ends a fault test: every id applied exactly once.
func (f *faultEnv) check(t *testing.T) {
	t.Helper()
	if err := f.exactlyOnce(f.s.Biz, f.ids); err != nil {
		t.Fatal(err)
	}
}

// The consumer process is killed (SIGKILL) right after the middleware
// committed a message, before the router acks it. The broker redelivers
// it to the next consumer, which acks it without running the handler.
func killedAfterCommit(t *testing.T, f *faultEnv) {
	f.ids = f.messages("kill", 8)
	f.publish(f.publisher(f.s), f.s, f.ids...)
	crash := f.s
	crash.CrashAfter = 3
	a := startChild(t, crash)
	killed, err := a.wait(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !killed {
		t.Fatalf("the consumer process exited without being killed: %v\n%s", a.cmd.ProcessState, a.out.String())
	}
	out := a.out.String()
	i := strings.Index(out, crashedAfter)
	if i < 0 {
		t.Fatalf("the consumer process did not say which message it committed:\n%s", out)
	}
	crashed, _, _ := strings.Cut(out[i+len(crashedAfter):], "\n")

	app := newApp(f.s)
	b := startTestConsumer(t, f.s, consumerOpts{app: app, store: f.store})
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{b}); err != nil {
		t.Fatal(err)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if n := app.ran(crashed); n != 0 {
		t.Errorf("the handler ran %d times for %s, which the killed process had committed; want 0 (acked from its record)", n, crashed)
	}
	f.check(t)
}

// The ack of some messages is lost after the commit. On NATS and
// watermill-sql it never reaches the broker, which redelivers the
// message once its ack wait or deadline ends. RabbitMQ loses an ack only
// with its connection, and then requeues the message (the killed
// process's test is that case): here its ack is replaced by a nack with
// requeue, the broker's own answer to an ack that never came, and it
// redelivers the message at once. The redeliveries are acked without
// running the handler.
func ackLost(t *testing.T, f *faultEnv) {
	f.ids = f.messages("lost", 8)
	app := newApp(f.s)
	o := consumerOpts{app: app, store: f.store}
	lose := func(*message.Message) {} // never acked: redelivered after the ack wait
	if f.s.Transport == "amqp" {
		lose = func(orig *message.Message) { orig.Nack() }
	}
	lostIDs := []string{f.ids[1], f.ids[4], f.ids[7]}
	var lost *lossy
	wrap := loseAcks(lose, lostIDs...)
	o.wrap = func(sub message.Subscriber) message.Subscriber {
		s := wrap(sub)
		lost = s.(*lossy)
		return s
	}
	c := startTestConsumer(t, f.s, o)
	f.publish(f.publisher(f.s), f.s, f.ids...)
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{c}, lost); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for _, id := range lostIDs {
		if n := app.ran(id); n != 1 {
			t.Errorf("the handler ran %d times for %s, whose ack was lost; want once (its redelivery acked from its record)", n, id)
		}
	}
	f.check(t)
}

// The handler of a message runs past the ack wait (NATS) or the ack
// deadline (watermill-sql): the broker redelivers it while it runs. The
// redelivery waits for it in memory, then is acked from its record.
func deadlineExpires(t *testing.T, f *faultEnv) {
	f.ids = f.messages("slow", 6)
	slow := f.ids[2]
	app := newApp(f.s)
	app.fault = func(ctx context.Context, id string, run int) error {
		if id == slow && run == 1 {
			time.Sleep(ackWait + time.Second) // the context is detached: the work goes on
		}
		return nil
	}
	c := startTestConsumer(t, f.s, consumerOpts{app: app, store: f.store})
	f.publish(f.publisher(f.s), f.s, f.ids...)
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{c}); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if n := app.ran(slow); n != 1 {
		t.Errorf("the handler ran %d times for %s, redelivered while it ran; want once", n, slow)
	}
	f.check(t)
}

// The handler fails twice for some messages, then succeeds: each
// failure rolls back and stores nothing, the message is nacked and
// redelivered, and the third run applies it.
func failsTwice(t *testing.T, f *faultEnv) {
	f.ids = f.messages("fail", 8)
	failing := map[string]bool{f.ids[0]: true, f.ids[3]: true, f.ids[6]: true}
	app := newApp(f.s)
	app.provider = &provider{}
	errBoom := errors.New("boom")
	app.fault = func(ctx context.Context, id string, run int) error {
		if failing[id] && run <= 2 {
			// A row first, so that the failure has something to roll back.
			if err := f.tg.exec(ctx, "INSERT INTO "+f.s.Biz+" (id, handler) VALUES ($1, $2)", id, "rolled back"); err != nil {
				return err
			}
			return errBoom
		}
		return nil
	}
	c := startTestConsumer(t, f.s, consumerOpts{app: app, store: f.store})
	f.publish(f.publisher(f.s), f.s, f.ids...)
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{c}); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for id := range failing {
		if n := app.ran(id); n != 3 {
			t.Errorf("the handler ran %d times for %s, which failed twice; want 3", n, id)
		}
	}
	if f.s.Mode == idemserve.ModeClaim {
		if n := app.provider.keys(); n != len(f.ids) {
			t.Errorf("the provider saw %d relay keys for %d messages: a retry must pass the same one", n, len(f.ids))
		}
	}
	f.check(t)
}

// The producer publishes every message three times, each time with its
// UUID: the first delivery applies it, the other two are acked from its
// record.
func publishedThrice(t *testing.T, f *faultEnv) {
	f.ids = f.messages("dup", 8)
	app := newApp(f.s)
	c := startTestConsumer(t, f.s, consumerOpts{app: app, store: f.store})
	pub := f.publisher(f.s)
	for range 3 {
		f.publish(pub, f.s, f.ids...)
	}
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{c}); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for _, id := range f.ids {
		if n := app.ran(id); n != 1 {
			t.Errorf("the handler ran %d times for %s, published three times; want once", n, id)
		}
	}
	f.check(t)
}

// Four consumer processes share one subscription (a durable consumer, a
// queue, a consumer group) while every message arrives three times,
// published from several goroutines at once. Then the processes stop,
// and one more consumer drains what they left unacked (RabbitMQ requeues
// what they held when they stopped).
func storm(t *testing.T, f *faultEnv) {
	f.ids = f.messages("storm", 24)
	children := make([]*child, 4)
	for i := range children {
		children[i] = startChild(t, f.s)
	}
	var all []string
	for range 3 {
		all = append(all, f.ids...)
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	pub := f.publisher(f.s)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(all); i += 4 {
				if err := pub.Publish(f.s.Topic, newMessage(all[i])); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// The processes stop once the broker has nothing left for them: a
	// watermill-nats subscriber closed while it hands a message over
	// races with itself (it closes its channel under the send).
	if err := f.settle(f.s, f.ids, f.patience(), nil); err != nil {
		t.Error(err)
	}
	for _, c := range children {
		if err := c.stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	}
	drain := startTestConsumer(t, f.s, consumerOpts{app: newApp(f.s), store: f.store})
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{drain}); err != nil {
		t.Fatal(err)
	}
	if err := drain.stop(); err != nil {
		t.Fatal(err)
	}
	f.check(t)
}

// The database connection of the handler's transaction is killed
// (pg_terminate_backend, KILL) while the handler runs: the transaction
// is lost, nothing is stored, the message is nacked, and its
// redelivery applies it.
func connectionKilled(t *testing.T, f *faultEnv) {
	f.ids = f.messages("conn", 6)
	victims := map[string]bool{f.ids[1]: true, f.ids[4]: true}
	app := newApp(f.s)
	app.fault = func(ctx context.Context, id string, run int) error {
		if !victims[id] || run > 1 {
			return nil
		}
		sid, err := f.tg.sessionID(ctx)
		if err != nil {
			return err
		}
		if err := f.kill(sid); err != nil {
			return fmt.Errorf("kill session %d: %w", sid, err)
		}
		return nil // the row's insert fails on the dead connection
	}
	c := startTestConsumer(t, f.s, consumerOpts{app: app, store: f.store})
	f.publish(f.publisher(f.s), f.s, f.ids...)
	if err := f.settle(f.s, f.ids, f.patience(), []*consumer{c}); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for id := range victims {
		if n := app.ran(id); n != 2 {
			t.Errorf("the handler ran %d times for %s, whose connection was killed; want 2", n, id)
		}
	}
	f.check(t)
}
