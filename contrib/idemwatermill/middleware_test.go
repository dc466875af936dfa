package idemwatermill_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// forEachDB runs f on PostgreSQL through database/sql and through pgx,
// and on MariaDB, in parallel.
func forEachDB(t *testing.T, f func(t *testing.T, e *env)) {
	t.Parallel()
	for _, tg := range []target{postgres, postgresPgx, mariadb} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			f(t, newEnv(t, tg))
		})
	}
}

// runRouter runs a router that add sets up, until the test ends.
func runRouter(t *testing.T, add func(r *message.Router)) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wmLogger(logTo(t)))
	if err != nil {
		t.Fatal(err)
	}
	add(r)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("the router stopped at once: %v", err)
	}
}

// subscriber is a subscriber of s's topic for the test, closed with its
// router.
func (e *env) subscriber(s spec) message.Subscriber {
	e.t.Helper()
	sub, err := s.subscriber(wmLogger(logTo(e.t)))
	if err != nil {
		e.t.Fatal(err)
	}
	return sub
}

// middleware is the middleware of cfg on a pool of its own, closed when
// the test ends.
func (e *env) middleware(store *idem.Store, mode idemserve.Mode, adjust func(*idemwatermill.Config)) message.HandlerMiddleware {
	e.t.Helper()
	p, err := openPool(e.tg, e.dsn, 4)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.close)
	cfg := p.config(store, mode)
	cfg.Logger = logTo(e.t)
	if adjust != nil {
		adjust(&cfg)
	}
	mw, err := idemwatermill.Middleware(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return mw
}

// eventually waits up to 30s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not after 30s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streamMessages reads every message of a NATS stream, in order.
func (e *env) streamMessages(url, stream string) []*jetstream.RawStreamMsg {
	e.t.Helper()
	js := e.jetStream(url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// A message whose UUID was applied, published again with another
// payload, is idem.ErrMismatch: it is not applied, and watermill's
// poison queue, filtered on IsPoison, takes it, so that it is acked and
// not redelivered for ever. So does a message without a valid key.
func TestMismatchAndInvalidKeyGoToThePoisonQueue(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		s := e.newSpec("nats", 30*time.Second)
		poison := e.newSpec("nats", 30*time.Second)
		store := e.store()
		app := newApp(s)
		poisonPub, err := wjs.NewPublisher(wjs.PublisherConfig{URL: poison.URL, Logger: watermill.NopLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { poisonPub.Close() })
		pq, err := middleware.PoisonQueueWithFilter(poisonPub, poison.Topic, idemwatermill.IsPoison)
		if err != nil {
			t.Fatal(err)
		}
		mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
			cfg.Key = idemwatermill.MetadataKey("idempotency_key")
		})
		tr := &tracker{Subscriber: e.subscriber(s)}
		runRouter(t, func(r *message.Router) {
			r.AddMiddleware(pq, mw)
			r.AddConsumerHandler(s.Handler, s.Topic, tr, app.handle)
		})
		pub := e.publisher(s)
		keyed := func(id, key, note string) *message.Message {
			b, _ := json.Marshal(payload{ID: id, Note: note})
			m := message.NewMessage(watermill.NewUUID(), b)
			if key != "" {
				m.Metadata.Set("idempotency_key", key)
			}
			return m
		}
		for _, m := range []*message.Message{
			keyed("order-1", "k-1", "first"),
			keyed("order-1", "k-1", "first"),        // a duplicate: acked from the record
			keyed("order-1", "k-1", "another"),      // the same key, another payload: poison
			keyed("order-2", "", ""),                // no key: poison
			keyed("order-3", "with space", "first"), // an invalid key: poison
		} {
			if err := pub.Publish(s.Topic, m); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "3 messages in the poison queue", func() bool { return len(e.streamMessages(poison.URL, poison.Topic)) == 3 })
		eventually(t, "every delivery acked", func() bool { n, err := e.pending(s); return err == nil && n == 0 })
		if err := e.exactlyOnce(s.Biz, []string{"order-1"}); err != nil {
			t.Fatal(err)
		}
		got := e.streamMessages(poison.URL, poison.Topic)
		var reasons []string
		for _, m := range got {
			reasons = append(reasons, m.Header.Get(middleware.ReasonForPoisonedKey))
		}
		if len(reasons) != 3 || !strings.Contains(reasons[0], "idempotency key reused") ||
			!strings.Contains(reasons[1], "invalid idempotency key") || !strings.Contains(reasons[2], "invalid idempotency key") {
			t.Fatalf("poisoned: %q, want a mismatch, then two invalid keys", reasons)
		}
		if n := app.ran("order-1"); n != 1 {
			t.Errorf("the handler ran %d times for order-1, want once", n)
		}
		if n := app.ran("order-2") + app.ran("order-3"); n != 0 {
			t.Errorf("the handler ran %d times for messages without a valid key, want never", n)
		}
	})
}

// A message whose key is empty, too long or not visible ASCII is an
// error that wraps idem.ErrInvalidKey, and its handler never runs.
func TestInvalidKeyIsNeverProcessed(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		store := e.store()
		ran := false
		for _, key := range []string{"", "with space", strings.Repeat("k", idem.MaxKeyLen+1), "é"} {
			mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
				cfg.Scope = "direct"
				cfg.Key = func(*message.Message) (string, error) { return key, nil }
			})
			h := mw(func(msg *message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
			if _, err := h(newMessage("m")); !errors.Is(err, idem.ErrInvalidKey) || !idemwatermill.IsPoison(err) {
				t.Errorf("key %q: %v, want an error wrapping idem.ErrInvalidKey", key, err)
			}
		}
		if ran {
			t.Fatal("the handler ran for a message without a valid key")
		}
	})
}

// Two handlers of one router consume the same messages (two durable
// consumers of one stream): the default scope, each handler's name,
// makes each apply every message once. A shared Config.Scope makes them
// one consumer: the second handler's delivery is acked from the first
// one's record.
func TestScopeIsTheHandlersName(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, shared := range []bool{false, true} {
			s := e.newSpec("nats", 30*time.Second)
			store := e.store()
			js := e.jetStream(s.URL)
			second := s.Topic + "_2"
			if _, err := js.CreateConsumer(context.Background(), s.Topic, jetstream.ConsumerConfig{Durable: second, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				t.Fatal(err)
			}
			scope := ""
			if shared {
				scope = "orders"
			}
			mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) { cfg.Scope = scope })
			billing, shipping := newApp(s), newApp(s)
			billing.handler, shipping.handler = "billing", "shipping"
			trs := []*tracker{{Subscriber: e.subscriber(s)}, {Subscriber: e.consumerSubscriber(s, second)}}
			runRouter(t, func(r *message.Router) {
				r.AddMiddleware(mw)
				r.AddConsumerHandler("billing", s.Topic, trs[0], billing.handle)
				r.AddConsumerHandler("shipping", s.Topic, trs[1], shipping.handle)
			})
			want := ids("scope", 5)
			pub := e.publisher(s)
			e.publish(pub, s, want...)
			e.publish(pub, s, want...) // redelivered to both
			eventually(t, "every delivery acked", func() bool {
				n, err := e.pending(s)
				return err == nil && n == 0 && trs[0].outstanding.Load() == 0 && trs[1].outstanding.Load() == 0 && len(e.applied(s.Biz)) == len(want)
			})
			time.Sleep(100 * time.Millisecond) // the second consumer's acks
			rows := e.applied(s.Biz)
			for _, id := range want {
				wantRows := 2
				if shared {
					wantRows = 1
				}
				if rows[id] != wantRows {
					t.Errorf("shared scope %v: %s applied %d times, want %d", shared, id, rows[id], wantRows)
				}
			}
		}
	})
}

// consumerSubscriber is a subscriber of s's stream through its durable
// consumer name.
func (e *env) consumerSubscriber(s spec, name string) message.Subscriber {
	e.t.Helper()
	sub, err := s.natsSubscriber(name, wmLogger(logTo(e.t)))
	if err != nil {
		e.t.Fatal(err)
	}
	return sub
}

// The fingerprint binds a key to the payload and to the metadata fields
// Config.Fingerprint names: another value of one is a mismatch; another
// value of a field it does not name is the same message, acked from its
// record.
func TestFingerprintNamesMetadataFields(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		store := e.store()
		mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
			cfg.Scope = "direct"
			cfg.Fingerprint = []string{"tenant", "version"}
		})
		var runs atomic.Int64
		h := mw(func(msg *message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })
		msg := func(payload, tenant, trace string) *message.Message {
			m := message.NewMessage("fp-1", []byte(payload))
			m.Metadata.Set("tenant", tenant)
			m.Metadata.Set("trace", trace)
			return m
		}
		for _, c := range []struct {
			m        *message.Message
			mismatch bool
		}{
			{msg(`{"a":1}`, "acme", "t1"), false},
			{msg(`{"a":1}`, "acme", "t2"), false}, // another trace: the same message
			{msg(`{"a":1}`, "other", "t1"), true}, // another tenant
			{msg(`{"a":2}`, "acme", "t1"), true},  // another payload
			{msg(`{"a":1}`, "acmeX", "t1"), true}, // fields are length-prefixed
			{msg(`{"a":1}`, "acme", "t3"), false},
		} {
			_, err := h(c.m)
			if c.mismatch != errors.Is(err, idem.ErrMismatch) || !c.mismatch && err != nil {
				t.Errorf("tenant %q, payload %s: %v, want mismatch %v", c.m.Metadata.Get("tenant"), c.m.Payload, err, c.mismatch)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
	})
}

// A handler error rolls back its rows and stores nothing: the message is
// nacked, and its redelivery runs the handler again. In ModeClaim the
// claim is released, so that the redelivery runs at once. A handler that
// panics does the same, and the panic goes on to the router, which
// nacks.
func TestHandlerErrorStoresNothing(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			store := e.store()
			biz := e.business()
			mw := e.middleware(store, mode, func(cfg *idemwatermill.Config) { cfg.Scope = "direct" })
			errBoom := errors.New("boom")
			var runs atomic.Int64
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				if err := e.tg.exec(msg.Context(), "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", msg.UUID, "h"); err != nil {
					return nil, err
				}
				switch runs.Add(1) {
				case 1:
					return nil, errBoom
				case 2:
					panic(errBoom)
				}
				return nil, nil
			})
			m := newMessage("err-1")
			if _, err := h(m); !errors.Is(err, errBoom) {
				t.Fatalf("%s: %v, want the handler's error", modeName(mode), err)
			}
			func() {
				defer func() {
					if p := recover(); p != errBoom {
						t.Errorf("%s: the handler's panic came back as %v", modeName(mode), p)
					}
				}()
				_, _ = h(m)
			}()
			rec, err := store.Inspect(context.Background(), e.db, "direct", "err-1")
			if err != nil {
				t.Fatal(err)
			}
			if rec != nil && rec.Status == idem.StatusCompleted {
				t.Fatalf("%s: the failed delivery stored %+v", modeName(mode), rec)
			}
			if n := e.applied(biz)["err-1"]; n != 0 {
				t.Fatalf("%s: the failed delivery left %d rows", modeName(mode), n)
			}
			if _, err := h(m); err != nil {
				t.Fatalf("%s: the redelivery: %v", modeName(mode), err)
			}
			if _, err := h(m); err != nil {
				t.Fatalf("%s: the second redelivery: %v", modeName(mode), err)
			}
			if err := e.exactlyOnce(biz, []string{"err-1"}); err != nil {
				t.Fatalf("%s: %v", modeName(mode), err)
			}
			if n := runs.Load(); n != 3 {
				t.Fatalf("%s: the handler ran %d times, want 3", modeName(mode), n)
			}
		}
	})
}

// A consumer without an outbox publishes nothing, so its answer is known
// before the handler runs: in transaction mode the record is written
// completed by the key's claim (idem.Store.ApplyOn), one statement,
// stamped with the claim's time; its redelivery is acked without
// running. In claim mode the record is completed after the handler, as
// ever.
func TestRecordWrittenWithTheClaim(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			store := e.store()
			biz := e.business()
			mw := e.middleware(store, mode, func(cfg *idemwatermill.Config) { cfg.Scope = "known" })
			var runs atomic.Int64
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				runs.Add(1)
				return nil, e.tg.exec(msg.Context(), "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", msg.UUID, "h")
			})
			id := "known-" + modeName(mode)
			m := newMessage(id)
			for range 2 {
				if _, err := h(m); err != nil {
					t.Fatalf("%s: %v", modeName(mode), err)
				}
			}
			rec, err := store.Inspect(context.Background(), e.db, "known", id)
			if err != nil || rec == nil || rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.StatusCode != 200 || len(rec.Response.Body) != 0 {
				t.Fatalf("%s: the record %+v, %v; want it completed with 200 and no body", modeName(mode), rec, err)
			}
			if withClaim := rec.CompletedAt.Equal(rec.CreatedAt); withClaim != (mode == idemserve.ModeTransaction) {
				t.Errorf("%s: the record was created at %v and completed at %v", modeName(mode), rec.CreatedAt, rec.CompletedAt)
			}
			if err := e.exactlyOnce(biz, []string{id}); err != nil || runs.Load() != 1 {
				t.Fatalf("%s: %v; the handler ran %d times, want once", modeName(mode), err, runs.Load())
			}
		}
	})
}

// A message redelivered after its record's retention (Config.Retention)
// is acked without running when the Store keeps a key memory, or the
// consumer's Config.KeyMemory gives its records one: its record refuses
// the key (idem.ErrExpired), and that means applied, even after a purge
// by a Store without key memory. Without one, the key is forgotten and
// the redelivery runs again, which is why the retention must outlive the
// broker's redelivery horizon. The acked redelivery's log line names the
// reference the record kept (Config.Reference).
func TestRedeliveryPastRetention(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		const retention = 200 * time.Millisecond
		for _, memory := range []string{"store", "config", "none"} {
			var opts []idem.Option
			if memory == "store" {
				opts = append(opts, idem.WithKeyMemory(time.Hour))
			}
			store := e.store(opts...)
			biz := e.business()
			var logged syncBuffer
			mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
				cfg.Logger = slog.New(slog.NewTextHandler(&logged, nil))
				cfg.Reference = func(msg *message.Message) string { return "orders/" + msg.UUID }
				cfg.Scope = "late"
				cfg.Retention = func(*message.Message) time.Duration { return retention }
				if memory == "config" {
					cfg.KeyMemory = func(*message.Message) time.Duration { return time.Hour }
				}
			})
			var runs atomic.Int64
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				runs.Add(1)
				return nil, e.tg.exec(msg.Context(), "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", fmt.Sprintf("%s-%d", msg.UUID, runs.Load()), "h")
			})
			m := newMessage("late-1")
			if _, err := h(m); err != nil {
				t.Fatal(err)
			}
			rec, err := store.Inspect(context.Background(), e.db, "late", "late-1")
			if err != nil || rec == nil || rec.ExpiresAt.Sub(rec.CompletedAt) > retention+time.Second {
				t.Fatalf("the record: %+v, %v; want it to expire about %v after its completion", rec, err, retention)
			}
			time.Sleep(retention + 100*time.Millisecond)
			plain, err := idem.New(e.tg.dialect, idem.WithTable(store.Table()))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := plain.Purge(context.Background(), e.db, 10); err != nil {
				t.Fatal(err)
			}
			if _, err := h(m); err != nil {
				t.Fatalf("key memory %v: the late redelivery: %v, want it acked", memory, err)
			}
			want := int64(1)
			if memory == "none" {
				want = 2
			}
			if n := runs.Load(); n != want {
				t.Fatalf("key memory %v: the handler ran %d times, want %d", memory, n, want)
			}
			if acked := strings.Contains(logged.String(), "reference=orders/late-1"); acked != (memory != "none") {
				t.Errorf("key memory %v: the log names the reference: %v; log: %s", memory, acked, logged.String())
			}
		}
	})
}

// watermill's Retry middleware, outside idemwatermill's, runs each
// retry in a transaction of its own: the failed attempts' rows are
// rolled back, and the one that succeeds commits once.
func TestRetryMiddleware(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		s := e.newSpec("nats", 30*time.Second)
		store := e.store()
		app := newApp(s)
		app.fault = func(ctx context.Context, id string, run int) error {
			if run <= 2 {
				if err := e.tg.exec(ctx, "INSERT INTO "+s.Biz+" (id, handler) VALUES ($1, $2)", id, "rolled back"); err != nil {
					return err
				}
				return fmt.Errorf("attempt %d fails", run)
			}
			return nil
		}
		retry := middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond,
			ShouldRetry: func(p middleware.RetryParams) bool { return !idemwatermill.IsPoison(p.Err) }}
		c := startTestConsumer(t, s, consumerOpts{app: app, store: store, outer: []message.HandlerMiddleware{retry.Middleware}})
		want := ids("retry", 4)
		e.publish(e.publisher(s), s, want...)
		if err := e.settle(s, want, 30*time.Second, []*consumer{c}); err != nil {
			t.Fatal(err)
		}
		for _, id := range want {
			if n := app.ran(id); n != 3 {
				t.Errorf("the handler ran %d times for %s, want 3 (two failures, then the retry that succeeds)", n, id)
			}
		}
		if err := e.exactlyOnce(s.Biz, want); err != nil {
			t.Fatal(err)
		}
	})
}

// In ModeClaim the handler calls its provider under a committed claim,
// with no transaction open, and writes its rows through TxFrom, which
// begins the transaction the claim is completed in. A redelivery that
// arrives while it runs finds the claim live: it is nacked after the
// Outcome's RetryAfter, which is never longer than the lease left, and
// not at once. Once the first completes, a redelivery is acked without
// running the handler.
func TestClaimModeRedeliveryWaitsForTheLease(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		const lease = 3 * time.Second
		store := e.store(idem.WithLease(lease))
		biz := e.business()
		mw := e.middleware(store, idemserve.ModeClaim, func(cfg *idemwatermill.Config) {
			cfg.Scope = "direct"
			cfg.RetryAfter = time.Minute // capped by the lease left
		})
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		var runs atomic.Int64
		var relayKeys sync.Map
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			runs.Add(1)
			claim := idemwatermill.ClaimFrom(ctx)
			if claim == nil {
				return nil, errors.New("no claim")
			}
			relayKeys.Store(claim.RelayKey(), true)
			started <- struct{}{}
			<-release // the provider's call
			return nil, e.tg.exec(ctx, "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", msg.UUID, "h")
		})
		first := make(chan error, 1)
		go func() {
			_, err := h(newMessage("claim-1"))
			first <- err
		}()
		select {
		case <-started:
		case err := <-first:
			t.Fatalf("the first delivery did not reach the provider: %v", err)
		}
		time.AfterFunc(500*time.Millisecond, func() { close(release) }) // the provider answers while the redelivery waits
		start := time.Now()
		_, err := h(newMessage("claim-1"))
		waited := time.Since(start)
		var inFlight *idem.InFlightError
		if !errors.As(err, &inFlight) {
			t.Fatalf("a redelivery while the claim is live: %v, want an InFlightError", err)
		}
		if waited < lease/2 || waited > lease+time.Second {
			t.Errorf("the redelivery was nacked after %v, want about the lease left (at most %v), not at once", waited, lease)
		}
		if err := <-first; err != nil {
			t.Fatalf("the first delivery: %v", err)
		}
		if _, err := h(newMessage("claim-1")); err != nil {
			t.Fatalf("a redelivery after the commit: %v", err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
		if err := e.exactlyOnce(biz, []string{"claim-1"}); err != nil {
			t.Fatal(err)
		}
	})
}

// In ModeTransaction a redelivery that reaches the process while the
// first delivery runs waits for it in memory, then is acked from its
// record without running the handler.
func TestTransactionModeRedeliveryWaitsInMemory(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		store := e.store()
		biz := e.business()
		mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) { cfg.Scope = "direct" })
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		var runs atomic.Int64
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			runs.Add(1)
			if err := e.tg.exec(msg.Context(), "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", msg.UUID, "h"); err != nil {
				return nil, err
			}
			started <- struct{}{}
			<-release
			return nil, nil
		})
		first := make(chan error, 1)
		go func() {
			_, err := h(newMessage("tx-1"))
			first <- err
		}()
		select {
		case <-started:
		case err := <-first:
			t.Fatalf("the first delivery did not start: %v", err)
		}
		second := make(chan error, 1)
		go func() {
			_, err := h(newMessage("tx-1"))
			second <- err
		}()
		time.Sleep(100 * time.Millisecond)
		close(release)
		if err := errors.Join(<-first, <-second); err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
		if err := e.exactlyOnce(biz, []string{"tx-1"}); err != nil {
			t.Fatal(err)
		}
	})
}

// The middleware refuses a Config it cannot use, and, at run time, a
// message it cannot record: one outside a router's handler without a
// Config.Scope, and a handler that returns messages with no outbox or
// no publish topic to write them to.
func TestRefusals(t *testing.T) {
	e := newEnv(t, postgres)
	store := e.store()
	short := e.store(idem.WithLease(time.Second))
	for name, cfg := range map[string]idemwatermill.Config{
		"no Store":               {DB: e.db},
		"no database":            {Store: store},
		"DB and Runner":          {Store: store, DB: e.db, Runner: idem.NewSQLRunner(e.db, nil)},
		"a long Scope":           {Store: store, DB: e.db, Scope: strings.Repeat("s", idem.MaxScopeLen+1)},
		"a Scope with NUL":       {Store: store, DB: e.db, Scope: "a\x00b"},
		"an empty field":         {Store: store, DB: e.db, Fingerprint: []string{""}},
		"a field twice":          {Store: store, DB: e.db, Fingerprint: []string{"a", "a"}},
		"a Timeout past a lease": {Store: short, DB: e.db, Mode: idemserve.ModeClaim, Timeout: time.Minute},
	} {
		if _, err := idemwatermill.Middleware(cfg); err == nil {
			t.Errorf("%s: Middleware accepted it", name)
		}
	}

	mw, err := idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: e.db})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(newMessage("no-scope")); err == nil || !strings.Contains(err.Error(), "Config.Scope") {
		t.Errorf("a message outside a router without Config.Scope: %v", err)
	}

	mw, err = idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: e.db, Scope: "direct"})
	if err != nil {
		t.Fatal(err)
	}
	returns := mw(func(*message.Message) ([]*message.Message, error) { return []*message.Message{newMessage("out")}, nil })
	if _, err := returns(newMessage("no-outbox")); err == nil || !strings.Contains(err.Error(), "Config.Outbox") {
		t.Errorf("a handler that returns messages without an outbox: %v", err)
	}
	if rec, err := store.Inspect(context.Background(), e.db, "direct", "no-outbox"); err != nil || rec != nil {
		t.Errorf("the refused delivery left %+v (%v)", rec, err)
	}
	if _, err := idemwatermill.PublisherFrom(context.Background()); err == nil {
		t.Error("PublisherFrom outside the middleware gave a publisher")
	}
	if tx := idemwatermill.TxFrom(context.Background()); tx != nil {
		t.Error("TxFrom outside the middleware gave a transaction")
	}
	if _, ok := idemwatermill.RequestFrom(context.Background()); ok {
		t.Error("RequestFrom outside the middleware gave a request")
	}
}

// A redelivery of a message whose record is sealed with a key this
// process lacks is acked without running: the record says the message
// was applied, and a nack would redeliver it in vain until the key is
// deployed.
func TestRedeliveryOfAnUnopenableRecord(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		sealer := func(id string) idem.Sealer {
			s, err := idem.NewAESGCMSealer(id, map[string][]byte{id: []byte(strings.Repeat(id[1:], 32))})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			store := e.store(idem.WithSealer(sealer("k1")))
			other, err := idem.New(e.tg.dialect, idem.WithTable(store.Table()), idem.WithSealer(sealer("k2")))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			handler := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }
			m := newMessage("sealed-" + modeName(mode))
			scoped := func(cfg *idemwatermill.Config) { cfg.Scope = "sealed" }
			if _, err := e.middleware(store, mode, scoped)(handler)(m); err != nil {
				t.Fatal(err)
			}
			if _, err := e.middleware(other, mode, scoped)(handler)(m); err != nil {
				t.Errorf("%s: the redelivery read by a process without the key: %v, want it acked", modeName(mode), err)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("%s: the handler ran %d times, want once", modeName(mode), n)
			}
		}
	})
}

// With Standbys, a message whose commit has not reached the standbys in
// StandbyWait (none stream from the test's server, and it asks for 50)
// is nacked with idem.ErrNotReplicated after RetryAfter, and so is its
// redelivery, which finds the record; the handler ran once and its row
// stands. MariaDB refuses the option, naming semi-synchronous
// replication.
func TestNotReplicatedNacks(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		store := e.store()
		if e.tg.dialect != idem.Postgres {
			p, err := openPool(e.tg, e.dsn, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			cfg := p.config(store, idemserve.ModeTransaction)
			cfg.Standbys = 1
			if _, err := idemwatermill.Middleware(cfg); err == nil || !strings.Contains(err.Error(), "rpl_semi_sync_master_enabled") {
				t.Fatalf("%v, want a refusal naming semi-synchronous replication", err)
			}
			return
		}
		biz := e.business()
		const retryAfter = 100 * time.Millisecond
		mw := e.middleware(store, idemserve.ModeTransaction, func(cfg *idemwatermill.Config) {
			cfg.Scope, cfg.Standbys, cfg.StandbyWait, cfg.RetryAfter = "direct", 50, 50*time.Millisecond, retryAfter
		})
		var runs atomic.Int64
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			runs.Add(1)
			return nil, e.tg.exec(msg.Context(), "INSERT INTO "+biz+" (id, handler) VALUES ($1, $2)", msg.UUID, "h")
		})
		m := newMessage("unreplicated-1")
		for attempt := range 2 {
			start := time.Now()
			if _, err := h(m); !errors.Is(err, idem.ErrNotReplicated) || time.Since(start) < retryAfter {
				t.Fatalf("delivery %d: %v after %v, want ErrNotReplicated after %v", attempt, err, time.Since(start), retryAfter)
			}
		}
		if n := e.applied(biz)["unreplicated-1"]; n != 1 || runs.Load() != 1 {
			t.Fatalf("%d rows and %d runs, want 1 and 1: the ack is withheld, not the commit", n, runs.Load())
		}
	})
}
