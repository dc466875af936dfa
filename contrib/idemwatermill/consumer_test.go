package idemwatermill_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// app is the handler the consumers run: it writes one business row per
// message through the middleware's transaction, after the fault it was
// given, if any.
type app struct {
	tg      target
	biz     string
	handler string
	// fault, when set, runs before the row is written, with the number
	// of the handler's run for the message's id in this process (from
	// 1); its error is the handler's.
	fault func(ctx context.Context, id string, run int) error
	// provider, when set, is called in ModeClaim with the claim's
	// RelayKey before the row is written.
	provider *provider

	mu   sync.Mutex
	runs map[string]int
}

func newApp(s spec) *app { return &app{tg: s.target(), biz: s.Biz, handler: s.Handler} }

func (a *app) handle(msg *message.Message) error {
	ctx := msg.Context()
	id := idOf(msg)
	a.mu.Lock()
	if a.runs == nil {
		a.runs = map[string]int{}
	}
	a.runs[id]++
	run := a.runs[id]
	a.mu.Unlock()
	if claim := idemwatermill.ClaimFrom(ctx); claim != nil && a.provider != nil {
		a.provider.call(claim.RelayKey())
	}
	if a.fault != nil {
		if err := a.fault(ctx, id, run); err != nil {
			return err
		}
	}
	return a.tg.exec(ctx, "INSERT INTO "+a.biz+" (id, handler) VALUES ($1, $2)", id, a.handler)
}

// ran is how many times the handler ran for id in this process.
func (a *app) ran(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[id]
}

// provider is an external service that deduplicates on its own key, as
// a payment provider does.
type provider struct {
	mu    sync.Mutex
	calls map[string]int // relay key → calls
}

func (p *provider) call(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[string]int{}
	}
	p.calls[key]++
}

// keys is how many distinct relay keys the provider was called with.
func (p *provider) keys() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

// consumerOpts are how a consumer of a spec runs, beside the spec.
type consumerOpts struct {
	app    *app
	store  *idem.Store
	logger *slog.Logger
	// outer are middlewares that wrap the middleware, in the order the
	// router runs them.
	outer []message.HandlerMiddleware
	// wrap decorates the subscriber (a lost ack), under the tracker.
	wrap func(message.Subscriber) message.Subscriber
}

// consumer is a router consuming a spec's topic through the middleware.
type consumer struct {
	router  *message.Router
	pool    *pool
	tracker *tracker
	done    chan error

	stopOnce sync.Once
	stopErr  error
}

// startConsumer starts a consumer of s, on a pool of its own.
func startConsumer(s spec, o consumerOpts) (*consumer, error) {
	p, err := openPool(s.target(), s.DSN, 4)
	if err != nil {
		return nil, err
	}
	c := &consumer{pool: p, done: make(chan error, 1)}
	if err := c.start(s, o); err != nil {
		p.close()
		return nil, err
	}
	return c, nil
}

func (c *consumer) start(s spec, o consumerOpts) error {
	logger := wmLogger(o.logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	cfg := c.pool.config(o.store, s.Mode)
	cfg.Logger = o.logger
	mw, err := idemwatermill.Middleware(cfg)
	if err != nil {
		return err
	}
	router.AddMiddleware(append(o.outer, mw)...)
	sub, err := s.subscriber(logger)
	if err != nil {
		return err
	}
	if o.wrap != nil {
		sub = o.wrap(sub)
	}
	c.tracker = &tracker{Subscriber: sub}
	router.AddConsumerHandler(s.Handler, s.Topic, c.tracker, o.app.handle)
	c.router = router
	go func() { c.done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
		return nil
	case err := <-c.done:
		return fmt.Errorf("the router stopped at once: %v", err)
	case <-time.After(30 * time.Second):
		_ = router.Close()
		return errors.New("the router did not start within 30s")
	}
}

// stop closes the router, which waits for the handlers that run, and
// the pool. Only its first call does.
func (c *consumer) stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.router.Close()
		if err := <-c.done; err != nil {
			c.stopErr = errors.Join(c.stopErr, err)
		}
		c.pool.close()
	})
	return c.stopErr
}

// startTestConsumer starts a consumer in the test's process, stopped
// when the test ends.
func startTestConsumer(t *testing.T, s spec, o consumerOpts) *consumer {
	t.Helper()
	if o.logger == nil {
		o.logger = logTo(t)
	}
	c, err := startConsumer(s, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.stop() })
	return c
}

// tracker is a subscriber that counts the deliveries the router has not
// acked or nacked yet.
type tracker struct {
	message.Subscriber
	outstanding atomic.Int64
}

func (tr *tracker) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := tr.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			tr.outstanding.Add(1)
			go func() {
				select {
				case <-m.Acked():
				case <-m.Nacked():
				case <-ctx.Done():
				}
				tr.outstanding.Add(-1)
			}()
			out <- m
		}
	}()
	return out, nil
}

// lossy is a subscriber that loses the first ack of the messages whose
// ids it is given: the router's ack reaches nothing, and lose gets the
// delivery the broker sent, which is never acked. It counts the lost
// messages whose redelivery has not been acked yet.
type lossy struct {
	message.Subscriber
	lose func(orig *message.Message)

	mu     sync.Mutex
	ids    map[string]bool // to lose, until lost
	unseen map[string]bool // lost, not acked since
}

func loseAcks(lose func(*message.Message), ids ...string) func(message.Subscriber) message.Subscriber {
	return func(sub message.Subscriber) message.Subscriber {
		l := &lossy{Subscriber: sub, lose: lose, ids: map[string]bool{}, unseen: map[string]bool{}}
		for _, id := range ids {
			l.ids[id] = true
		}
		return l
	}
}

func (l *lossy) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := l.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			id := idOf(m)
			l.mu.Lock()
			take := l.ids[id]
			delete(l.ids, id)
			l.mu.Unlock()
			if !take {
				go func() {
					select {
					case <-m.Acked():
						l.mu.Lock()
						delete(l.unseen, id)
						l.mu.Unlock()
					case <-m.Nacked():
					case <-ctx.Done():
					}
				}()
				out <- m
				continue
			}
			c := m.Copy()
			c.SetContext(m.Context())
			go func() {
				select {
				case <-c.Acked():
					l.mu.Lock()
					l.unseen[id] = true
					l.mu.Unlock()
					l.lose(m)
				case <-c.Nacked():
					m.Nack()
				case <-ctx.Done():
				}
			}()
			out <- c
		}
	}()
	return out, nil
}

// lostNotRedelivered is how many lost acks have no acked redelivery yet,
// and how many acks are still to lose.
func (l *lossy) lostNotRedelivered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.unseen) + len(l.ids)
}

// settle waits, up to d, until every id is applied, the broker has
// nothing left unacked of s's topic and the consumers have no delivery
// outstanding, nor lost acks unresolved.
func (e *env) settle(s spec, want []string, d time.Duration, consumers []*consumer, lost ...*lossy) error {
	deadline := time.Now().Add(d)
	for {
		var why []string
		got := e.applied(s.Biz)
		missing := 0
		for _, id := range want {
			if got[id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			why = append(why, fmt.Sprintf("%d of %d messages not applied", missing, len(want)))
		}
		if n, err := e.pending(s); err != nil || n > 0 {
			why = append(why, fmt.Sprintf("%d pending on the broker (%v)", n, err))
		}
		for _, c := range consumers {
			if n := c.tracker.outstanding.Load(); n > 0 {
				why = append(why, fmt.Sprintf("%d deliveries not acked or nacked", n))
			}
		}
		for _, l := range lost {
			if n := l.lostNotRedelivered(); n > 0 {
				why = append(why, fmt.Sprintf("%d lost acks not redelivered and acked", n))
			}
		}
		if len(why) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %v: %v", d, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// child is a consumer process: the test binary run with consumerEnv.
type child struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startChild starts a consumer process of s, killed when the test ends
// if it still runs.
func startChild(t *testing.T, s spec) *child {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(os.Args[0]), out: &syncBuffer{}, done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), consumerEnv+"="+string(b))
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("consumer process %d:\n%s", c.cmd.Process.Pid, c.out.String())
		}
	})
	return c
}

// wait waits up to d for the process to exit, and reports whether it
// was killed by SIGKILL.
func (c *child) wait(d time.Duration) (killed bool, err error) {
	select {
	case <-c.done:
	case <-time.After(d):
		return false, fmt.Errorf("consumer process %d still runs after %v", c.cmd.Process.Pid, d)
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, nil
}

// stop asks the process to stop (SIGTERM: it closes its router, which
// waits for its handlers) and waits for it.
func (c *child) stop(d time.Duration) error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if _, err := c.wait(d); err != nil {
		return err
	}
	if !c.cmd.ProcessState.Success() {
		return fmt.Errorf("consumer process %d: %v", c.cmd.Process.Pid, c.cmd.ProcessState)
	}
	return nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// crashedAfter is the line a child prints before it kills itself.
const crashedAfter = "committed, killing myself before the ack: "

// runChild runs a consumer of the spec in JSON, until SIGTERM, and
// returns the process's exit code.
func runChild(js string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		logger.Error("consumer process", "err", err)
		return 1
	}
	var s spec
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		return fail(err)
	}
	store, err := idem.New(s.target().dialect, idem.WithTable(s.Table))
	if err != nil {
		return fail(err)
	}
	o := consumerOpts{app: newApp(s), store: store, logger: logger}
	if s.CrashAfter > 0 {
		var commits atomic.Int64
		o.outer = append(o.outer, func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err == nil && commits.Add(1) == int64(s.CrashAfter) {
					fmt.Println(crashedAfter + idOf(msg))
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
				return out, err
			}
		})
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	c, err := startConsumer(s, o)
	if err != nil {
		return fail(err)
	}
	<-term
	if err := c.stop(); err != nil {
		return fail(err)
	}
	return 0
}

// modeName names a mode in a test's name.
func modeName(m idemserve.Mode) string {
	if m == idemserve.ModeClaim {
		return "claim"
	}
	return "tx"
}
