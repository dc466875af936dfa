package idemgrpc_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemserve"
)

// storm sends n concurrent calls with one key and returns their answers.
func storm(ctx context.Context, cc *grpc.ClientConn, n int, key string) []result {
	rs := make([]result, n)
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() { rs[j] = call(withKey(ctx, key), cc, methodCharge, 100) })
	}
	wg.Wait()
	return rs
}

// 16 concurrent duplicates make one charge. In ModeTransaction they wait
// for the first and replay it, under the default isolation level and
// SERIALIZABLE; in ModeClaim they are told UNAVAILABLE and a client whose
// retry policy retries it converges on the replay.
func TestStorm(t *testing.T) {
	const n = 16
	forEachDB(t, func(t *testing.T, e *env) {
		for _, opts := range []*sql.TxOptions{nil, {Isolation: sql.LevelSerializable}} {
			level := "default"
			if opts != nil {
				level = "serializable"
			}
			t.Run("transaction/"+level, func(t *testing.T) {
				a := e.api()
				a.delay = 100 * time.Millisecond
				srv, _ := e.serveIdem(idemgrpc.Config{TxOptions: opts}, a)
				rs := storm(t.Context(), dial(t, srv.addr), n, "storm-1")
				checkStorm(t, rs, n)
				if got := e.rows(a.biz, "storm-1"); got != 1 || a.calls.Load() != 1 {
					t.Fatalf("%d rows, handler ran %d times; want 1 and 1", got, a.calls.Load())
				}
			})
		}
		t.Run("claim", func(t *testing.T) {
			a := e.api()
			a.provider = &provider{delay: 300 * time.Millisecond}
			srv, _ := e.serveIdem(idemgrpc.Config{Mode: idemserve.ModeClaim, RetryAfter: 200 * time.Millisecond}, a)
			rs := storm(t.Context(), dial(t, srv.addr, grpc.WithDefaultServiceConfig(retryPolicy)), n, "storm-2")
			checkStorm(t, rs, n)
			if got, calls := e.rows(a.biz, "storm-2"), a.provider.seen(); got != 1 || len(calls) != 1 {
				t.Fatalf("%d rows, %d provider calls; want 1 and 1", got, len(calls))
			}
		})
	})
}

// checkStorm asserts that every call got the same OK answer, one fresh
// and the others replays.
func checkStorm(t *testing.T, rs []result, n int) {
	t.Helper()
	fresh := 0
	for _, r := range rs {
		if r.status.Code() != codes.OK {
			t.Fatalf("a duplicate got %v", r)
		}
		if !r.replayed {
			fresh++
		}
	}
	if err := sameAnswers(rs); err != nil {
		t.Fatal(err)
	}
	if fresh != 1 {
		t.Fatalf("%d fresh answers of %d, want 1", fresh, n)
	}
}

// A client whose deadline is shorter than the handler gives up, then
// retries with the same key: the handler's work is not cancelled with
// the first call, it runs once and commits, and a retry gets its answer
// replayed. In both modes.
func TestClientGivesUp(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			t.Run(modeName(mode), func(t *testing.T) {
				a := e.api()
				a.delay = 800 * time.Millisecond
				a.provider = &provider{}
				srv, _ := e.serveIdem(idemgrpc.Config{Mode: mode}, a)
				cc := dial(t, srv.addr)
				key := ""
				var timeouts int
				var oks []result
				for attempt := range 6 {
					if attempt > 0 {
						time.Sleep(300 * time.Millisecond)
					}
					ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 250*time.Millisecond)
					r := call(ctx, cc, methodCharge, 12, idemgrpc.UseKey(&key))
					cancel()
					switch r.status.Code() {
					case codes.OK:
						oks = append(oks, r)
					case codes.DeadlineExceeded:
						timeouts++
					case codes.Unavailable: // ModeClaim: in flight
					default:
						t.Fatalf("attempt %d: %v", attempt+1, r)
					}
				}
				if timeouts == 0 || len(oks) == 0 {
					t.Fatalf("%d timeouts, %d answers; want the first attempt to time out and a retry to get the replay", timeouts, len(oks))
				}
				for _, r := range oks {
					if !r.replayed {
						t.Fatalf("a retry got a fresh answer %v; want the replay", r)
					}
				}
				if err := sameAnswers(oks); err != nil {
					t.Fatal(err)
				}
				if got := e.rows(a.biz, key); got != 1 || a.calls.Load() != 1 {
					t.Fatalf("%d rows, handler ran %d times; want 1 and 1", got, a.calls.Load())
				}
			})
		}
	})
}

func modeName(m idemserve.Mode) string {
	if m == idemserve.ModeClaim {
		return "claim"
	}
	return "transaction"
}

// Every connection is cut while four calls run; the clients retry with
// their keys through new connections. Each key ends with one row, the
// handler having run once for it, and every answer of a key is the same.
func TestConnectionsDropped(t *testing.T) {
	const keys = 4
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			t.Run(modeName(mode), func(t *testing.T) {
				a := e.api()
				a.delay = 500 * time.Millisecond
				a.provider = &provider{}
				a.started = make(chan struct{}, 2*keys)
				srv, _ := e.serveIdem(idemgrpc.Config{Mode: mode}, a)
				p := startProxy(t, srv.addr)
				cc := dial(t, p.addr())
				finals := make([]result, keys)
				oks := make([][]result, keys)
				used := make([]string, keys)
				var wg sync.WaitGroup
				for j := range keys {
					wg.Go(func() {
						finals[j], oks[j] = retrying(t.Context(), cc, &used[j], 7, 2*time.Second, 100*time.Millisecond)
					})
				}
				for range keys {
					a.waitStarted(t)
				}
				p.cut()
				wg.Wait()
				for j := range keys {
					if finals[j].status.Code() != codes.OK {
						t.Fatalf("key %s: %v", used[j], finals[j])
					}
					if err := sameAnswers(oks[j]); err != nil {
						t.Fatalf("key %s: %v", used[j], err)
					}
					if got := e.rows(a.biz, used[j]); got != 1 {
						t.Fatalf("key %s: %d rows, want 1", used[j], got)
					}
				}
				if a.calls.Load() != keys {
					t.Fatalf("the handler ran %d times for %d keys", a.calls.Load(), keys)
				}
			})
		}
	})
}

// The server is stopped (Stop: connections closed at once) while a call
// runs, and a new one, with a pool and a Store of its own as a restarted
// process has, serves on the same address. The client retries with its
// key and gets the one answer:
//   - "finishes": the stopped server's handler goes on and commits; the
//     retry on the new server replays it;
//   - "dies": the stopped server's database session dies with it (its
//     transaction rolls back; in ModeClaim its claim stays until the
//     lease ends); the retry runs the call again, once (in ModeClaim it
//     takes the claim over and the provider sees the same RelayKey).
func TestServerRestart(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			for _, dies := range []bool{false, true} {
				name := modeName(mode) + "/finishes"
				if dies {
					name = modeName(mode) + "/dies"
				}
				t.Run(name, func(t *testing.T) { testRestart(t, e, mode, dies) })
			}
		}
	})
}

func testRestart(t *testing.T, e *env, mode idemserve.Mode, dies bool) {
	a := e.api()
	a.delay = 400 * time.Millisecond
	a.provider = &provider{}
	a.started = make(chan struct{}, 10)
	stopped := make(chan struct{})
	var killErr atomic.Value
	first := e.open(0) // the first process's pool
	a.hook = func(ctx context.Context, run int64) error {
		if run > 1 {
			return nil // the restarted server's run
		}
		<-stopped
		if !dies {
			return nil
		}
		if mode == idemserve.ModeClaim {
			first.close() // the process is gone: its transaction cannot begin, its claim is not released
			return nil
		}
		id, err := e.sessionID(ctx)
		if err == nil {
			err = e.kill(id)
		}
		if err != nil {
			killErr.Store(err)
		}
		return nil // the insert then fails on the dead session
	}
	lease := 30 * time.Second
	if mode == idemserve.ModeClaim {
		lease = 2 * time.Second
	}
	s := e.store(idem.WithLease(lease))
	srv1, _ := e.serveIdem(idemgrpc.Config{Mode: mode, Store: s, Runner: first.runner(nil), RetryAfter: 200 * time.Millisecond}, a)
	addr := srv1.addr
	cc := dial(t, addr, grpc.WithDefaultServiceConfig(retryPolicy))
	key := idemgrpc.NewKey()
	var (
		final result
		oks   []result
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		final, oks = retrying(t.Context(), cc, &key, 9, 5*time.Second, 100*time.Millisecond)
	}()
	a.waitStarted(t)
	srv1.stop()
	second := e.open(0)
	serve(t, addr, a, mustNew(t, idemgrpc.Config{Mode: mode, Store: e.also(s, idem.WithLease(lease)), Runner: second.runner(nil), Scope: byCaller, RetryAfter: 200 * time.Millisecond, Logger: logTo(t)}).Unary())
	close(stopped)
	<-done
	if err, _ := killErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	if final.status.Code() != codes.OK {
		t.Fatalf("the client got %v", final)
	}
	if err := sameAnswers(oks); err != nil {
		t.Fatal(err)
	}
	want := int64(1)
	if dies {
		want = 2
	}
	if got, calls := e.rows(a.biz, key), a.calls.Load(); got != 1 || calls != want {
		t.Fatalf("%d rows, handler ran %d times; want 1 and %d", got, calls, want)
	}
	if mode == idemserve.ModeClaim {
		seen := a.provider.seen()
		for _, k := range seen {
			if k != seen[0] {
				t.Fatalf("the provider saw relay keys %q; want one key for every run", seen)
			}
		}
	}
}

func mustNew(t *testing.T, cfg idemgrpc.Config) *idemgrpc.Interceptor {
	t.Helper()
	in, err := idemgrpc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// counting counts the attempts of each key that reach the server, before
// the interceptor: how often a client sent a call.
type counting struct {
	mu       sync.Mutex
	attempts map[string]int
}

func (c *counting) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	if c.attempts == nil {
		c.attempts = map[string]int{}
	}
	c.attempts[fmt.Sprint(metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey))]++
	c.mu.Unlock()
	return handler(ctx, req)
}

func (c *counting) of(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempts[fmt.Sprint([]string{key})]
}

// A key reused with another request is FAILED_PRECONDITION, which a
// client whose retry policy retries UNAVAILABLE sends once; a duplicate
// held UNAVAILABLE is retried by the same client until it replays.
func TestRetryPolicy(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		a.provider = &provider{delay: time.Second}
		a.started = make(chan struct{}, 10)
		var count counting
		srv, _ := e.serveIdem(idemgrpc.Config{Mode: idemserve.ModeClaim, RetryAfter: 400 * time.Millisecond}, a, count.interceptor)
		cc := dial(t, srv.addr, grpc.WithDefaultServiceConfig(retryPolicy))
		ctx := t.Context()

		firstDone := make(chan result, 1)
		go func() { firstDone <- call(withKey(ctx, "policy-1"), cc, methodCharge, 5) }()
		a.waitStarted(t)
		dup := call(withKey(ctx, "policy-1"), cc, methodCharge, 5)
		first := <-firstDone
		if first.status.Code() != codes.OK || dup.status.Code() != codes.OK || !dup.replayed {
			t.Fatalf("first %v, duplicate %v; want OK and its replay", first, dup)
		}
		if err := sameAnswers([]result{first, dup}); err != nil {
			t.Fatal(err)
		}
		if n := count.of("policy-1"); n < 3 {
			t.Fatalf("the server saw %d attempts of the key; want the first and the duplicate retried by gRPC at least once", n)
		}

		r := call(withKey(ctx, "policy-1"), cc, methodCharge, 6)
		checkStatus(t, r, codes.FailedPrecondition, idemgrpc.ReasonMismatch)
		var pf *errdetails.PreconditionFailure
		for _, d := range r.status.Details() {
			if v, ok := d.(*errdetails.PreconditionFailure); ok {
				pf = v
			}
		}
		if pf == nil || pf.GetViolations()[0].GetType() != idemgrpc.ReasonMismatch {
			t.Fatalf("details %v; want a PreconditionFailure of type %s", r.status.Details(), idemgrpc.ReasonMismatch)
		}
		r = call(withKey(ctx, "policy-1"), cc, methodRefund, 5)
		checkStatus(t, r, codes.FailedPrecondition, idemgrpc.ReasonMismatch)
		before := count.of("policy-1")
		call(withKey(ctx, "policy-1"), cc, methodCharge, 6)
		if n := count.of("policy-1") - before; n != 1 {
			t.Fatalf("the mismatch was sent %d times, want once: it must not be retried", n)
		}
		if got := e.rows(a.biz, "policy-1"); got != 1 {
			t.Fatalf("%d rows, want 1", got)
		}
	})
}

// checkStatus asserts r's code and the reason of its ErrorInfo.
func checkStatus(t *testing.T, r result, code codes.Code, reason string) *errdetails.ErrorInfo {
	t.Helper()
	if r.status.Code() != code {
		t.Fatalf("got %v, want %v", r, code)
	}
	for _, d := range r.status.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != reason || info.GetDomain() != idemgrpc.ErrorDomain {
				t.Fatalf("ErrorInfo %v, want reason %s in domain %s", info, reason, idemgrpc.ErrorDomain)
			}
			return info
		}
	}
	t.Fatalf("%v has no ErrorInfo", r)
	return nil
}

// retryInfo is the RetryInfo of r, which must have one.
func retryInfo(t *testing.T, r result) time.Duration {
	t.Helper()
	for _, d := range r.status.Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok {
			return info.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("%v has no RetryInfo", r)
	return 0
}

// With idem.WithLockTimeout(500ms) and a call that takes 1.5 s, a
// duplicate that waits in memory in the same process and one that waits
// on the row lock through another instance (another Store and pool on
// the same table) both give up after the bound with the same answer:
// UNAVAILABLE, the same RetryInfo and pushback. The call itself then
// commits once.
func TestLockTimeoutSameAnswer(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		a.delay = 1500 * time.Millisecond
		a.started = make(chan struct{}, 10)
		var inFlight atomic.Int64 // EventInFlight, of both instances
		observe := idem.WithObserver(idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
			if ev.Kind == idem.EventInFlight {
				inFlight.Add(1)
			}
		}))
		s := e.store(idem.WithLockTimeout(500*time.Millisecond), observe)
		one, _ := e.serveIdem(idemgrpc.Config{Store: s, RetryAfter: 5 * time.Second}, a)
		other, _ := e.serveIdem(idemgrpc.Config{Store: e.also(s, idem.WithLockTimeout(500*time.Millisecond), observe), Runner: e.open(0).runner(nil), RetryAfter: 5 * time.Second}, a)
		ctx := t.Context()
		ccOne, ccOther := dial(t, one.addr), dial(t, other.addr)
		firstDone := make(chan result, 1)
		go func() { firstDone <- call(withKey(ctx, "bound-1"), ccOne, methodCharge, 3) }()
		a.waitStarted(t)
		var same, across result
		var wg sync.WaitGroup
		wg.Go(func() { same = call(withKey(ctx, "bound-1"), ccOne, methodCharge, 3) })
		wg.Go(func() { across = call(withKey(ctx, "bound-1"), ccOther, methodCharge, 3) })
		wg.Wait()
		for _, r := range []result{same, across} {
			checkStatus(t, r, codes.Unavailable, idemgrpc.ReasonInFlight)
			if d := retryInfo(t, r); d != time.Second {
				t.Fatalf("RetryInfo %v, want 1s: the lock timeout rounded up to a second", d)
			}
			if p := r.trailer.Get("grpc-retry-pushback-ms"); len(p) != 1 || p[0] != "1000" {
				t.Fatalf("pushback %q, want 1000", p)
			}
		}
		if n := inFlight.Load(); n != 2 {
			t.Fatalf("%d in_flight events, want one per instance", n)
		}
		if !proto.Equal(same.status.Proto(), across.status.Proto()) {
			t.Fatalf("in the same process: %v; through another instance: %v", same.status.Proto(), across.status.Proto())
		}
		if first := <-firstDone; first.status.Code() != codes.OK {
			t.Fatalf("first call: %v", first)
		}
		if got := e.rows(a.biz, "bound-1"); got != 1 || a.calls.Load() != 1 {
			t.Fatalf("%d rows, handler ran %d times; want 1 and 1", got, a.calls.Load())
		}
	})
}

// A stored answer replays exactly: a declined charge's status (code,
// message, details) and an OK reply, each with the header and trailer
// metadata ReplayMetadata lists (and not the rest), marked
// idempotent-replayed: true. The decline's row commits with it.
func TestReplayExact(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		decline := func(ctx context.Context, _ int64) error {
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge", "ch_1", "x-trace", "t-1"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger-bin", "\x00\xff"))
			if !shouldDecline(ctx) {
				return nil
			}
			req, _ := idemgrpc.RequestFrom(ctx)
			if err := e.insert(ctx, a.biz, req.Key, "declined", 0); err != nil {
				return err
			}
			st, _ := status.New(codes.FailedPrecondition, "card declined: insufficient funds").WithDetails(
				&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com", Metadata: map[string]string{"decline_code": "insufficient_funds"}})
			return st.Err()
		}
		a.hook = decline
		srv, _ := e.serveIdem(idemgrpc.Config{ReplayMetadata: []string{"X-Charge", "x-ledger-bin"}}, a)
		cc := dial(t, srv.addr)
		for _, key := range []string{"decline-1", "ok-1"} {
			ctx := withKey(t.Context(), key)
			if key == "decline-1" {
				ctx = metadata.AppendToOutgoingContext(ctx, "decline", "yes")
			}
			first := call(ctx, cc, methodCharge, 40)
			again := call(ctx, cc, methodCharge, 40)
			if first.replayed || !again.replayed {
				t.Fatalf("%s: replayed %v then %v; want false then true", key, first.replayed, again.replayed)
			}
			if err := sameAnswers([]result{first, again}); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if key == "decline-1" && (first.status.Code() != codes.FailedPrecondition || len(again.status.Details()) != 1) {
				t.Fatalf("%s: %v with %v", key, again, again.status.Details())
			}
			if v := first.header.Get("x-trace"); len(v) != 1 {
				t.Fatalf("%s: the first answer lacks x-trace: %v", key, first.header)
			}
			if v := again.header.Get("x-trace"); len(v) != 0 {
				t.Fatalf("%s: x-trace replayed: %v", key, again.header)
			}
			for _, md := range []struct {
				name     string
				got, was metadata.MD
				key      string
			}{{"header", again.header, first.header, "x-charge"}, {"trailer", again.trailer, first.trailer, "x-ledger-bin"}} {
				if fmt.Sprint(md.got.Get(md.key)) != fmt.Sprint(md.was.Get(md.key)) || len(md.got.Get(md.key)) != 1 {
					t.Fatalf("%s: replayed %s %s %q, first %q", key, md.name, md.key, md.got.Get(md.key), md.was.Get(md.key))
				}
			}
			if got := e.rows(a.biz, key); got != 1 || a.calls.Load() != map[string]int64{"decline-1": 1, "ok-1": 2}[key] {
				t.Fatalf("%s: %d rows, handler ran %d times", key, got, a.calls.Load())
			}
		}
	})
}

func shouldDecline(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, "decline")) > 0
}

// What a handler answers with a code that asks for a retry, or a server
// error, is rolled back and not stored (a claim is released): the retry
// runs the handler again. With StoreServerErrors an INTERNAL is a result.
func TestFailuresNotStored(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			t.Run(modeName(mode), func(t *testing.T) {
				for j, code := range []codes.Code{codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.Internal, codes.Unknown} {
					a := e.api()
					a.provider = &provider{}
					a.hook = func(ctx context.Context, run int64) error {
						req, _ := idemgrpc.RequestFrom(ctx)
						if err := e.insert(ctx, a.biz, req.Key, "failed", 0); err != nil {
							return err
						}
						if run == 1 {
							if code == codes.Unknown {
								return errors.New("a plain error") // gRPC sends UNKNOWN
							}
							return status.Error(code, "try again")
						}
						return nil
					}
					srv, _ := e.serveIdem(idemgrpc.Config{Mode: mode}, a)
					cc := dial(t, srv.addr)
					key := fmt.Sprintf("fail-%d", j)
					if r := call(withKey(t.Context(), key), cc, methodCharge, 1); r.status.Code() != code || r.replayed {
						t.Fatalf("%v: first call got %v", code, r)
					}
					if got := e.rows(a.biz, key); got != 0 {
						t.Fatalf("%v: %d rows after the failure, want 0", code, got)
					}
					if r := call(withKey(t.Context(), key), cc, methodCharge, 1); r.status.Code() != codes.OK || r.replayed {
						t.Fatalf("%v: the retry got %v, want a fresh OK", code, r)
					}
					if got := e.rows(a.biz, key); got != 2 || a.calls.Load() != 2 {
						t.Fatalf("%v: %d rows and %d runs, want 2 (the retry's two) and 2", code, got, a.calls.Load())
					}
				}
				a := e.api()
				a.provider = &provider{}
				a.hook = func(context.Context, int64) error { return status.Error(codes.Internal, "stored") }
				srv, _ := e.serveIdem(idemgrpc.Config{Mode: mode, StoreServerErrors: true}, a)
				cc := dial(t, srv.addr)
				first := call(withKey(t.Context(), "stored-1"), cc, methodCharge, 1)
				again := call(withKey(t.Context(), "stored-1"), cc, methodCharge, 1)
				if first.status.Code() != codes.Internal || !again.replayed || a.calls.Load() != 1 {
					t.Fatalf("StoreServerErrors: %v then %v (replayed %v), %d runs", first, again, again.replayed, a.calls.Load())
				}
			})
		}
	})
}

// The interceptor's own refusals: a missing key where Required, a
// malformed key, two keys; and a call without a key where not Required
// runs each time, with nothing recorded.
func TestKeys(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		srv, _ := e.serveIdem(idemgrpc.Config{Required: true}, a)
		cc := dialBare(t, srv.addr)
		ctx := as(t.Context(), "alice")
		r := call(ctx, cc, methodCharge, 1)
		checkStatus(t, r, codes.InvalidArgument, idemgrpc.ReasonMissingKey)
		var br *errdetails.BadRequest
		for _, d := range r.status.Details() {
			if v, ok := d.(*errdetails.BadRequest); ok {
				br = v
			}
		}
		if br == nil || br.GetFieldViolations()[0].GetField() != idemgrpc.MetadataKey {
			t.Fatalf("details %v; want a BadRequest on %s", r.status.Details(), idemgrpc.MetadataKey)
		}
		for _, bad := range [][]string{{""}, {"has space"}, {strings.Repeat("k", 256)}, {"a", "b"}} {
			md := metadata.MD{idemgrpc.MetadataKey: bad}
			r := call(metadata.NewOutgoingContext(t.Context(), metadata.Join(md, metadata.Pairs("caller", "alice"))), cc, methodCharge, 1)
			checkStatus(t, r, codes.InvalidArgument, idemgrpc.ReasonInvalidKey)
		}
		noCaller := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "k-1")
		if r := call(noCaller, cc, methodCharge, 1); r.status.Code() != codes.Unauthenticated {
			t.Fatalf("a Scope that answers UNAUTHENTICATED: %v", r)
		}
		if a.calls.Load() != 0 {
			t.Fatalf("the handler ran %d times for refused calls", a.calls.Load())
		}

		b := e.api()
		open, s := e.serveIdem(idemgrpc.Config{}, b)
		cc = dialBare(t, open.addr)
		for range 2 {
			if r := call(ctx, cc, methodCharge, 1); r.status.Code() != codes.OK || r.replayed {
				t.Fatalf("a call without a key got %v", r)
			}
		}
		if got := e.rows(b.biz, ""); got != 2 {
			t.Fatalf("%d rows for two calls without a key, want 2", got)
		}
		var records int
		if err := e.db.QueryRow("SELECT COUNT(*) FROM " + s.Table()).Scan(&records); err != nil || records != 0 {
			t.Fatalf("%d records (%v), want 0", records, err)
		}
	})
}

// A method listed in NoSideEffects passes through: no transaction, no key
// handling, even with a key.
func TestPassThrough(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		srv, s := e.serveIdem(idemgrpc.Config{Required: true, NoSideEffects: []string{methodGet}}, a)
		cc := dial(t, srv.addr)
		for _, ctx := range []context.Context{t.Context(), withKey(t.Context(), "get-1")} {
			reply := &structpb.Struct{}
			if err := cc.Invoke(ctx, methodGet, wrapperspb.String("ch_1"), reply); err != nil {
				t.Fatal(err)
			}
			if reply.GetFields()["tx"].GetBoolValue() || reply.GetFields()["keyed"].GetBoolValue() {
				t.Fatalf("Get ran with %v; want no transaction and no key", reply.AsMap())
			}
		}
		var records int
		if err := e.db.QueryRow("SELECT COUNT(*) FROM " + s.Table()).Scan(&records); err != nil || records != 0 {
			t.Fatalf("%d records (%v), want 0", records, err)
		}
	})
}

// In ModeClaim the handler calls a slow provider with no transaction
// open, passing the claim's RelayKey, which is the same for every
// attempt; duplicates meanwhile are UNAVAILABLE with a RetryInfo of
// RetryAfter.
func TestClaimSlowProvider(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		a.provider = &provider{delay: 600 * time.Millisecond}
		a.started = make(chan struct{}, 10)
		srv, _ := e.serveIdem(idemgrpc.Config{Mode: idemserve.ModeClaim, RetryAfter: 300 * time.Millisecond}, a)
		cc := dial(t, srv.addr)
		firstDone := make(chan result, 1)
		go func() { firstDone <- call(withKey(t.Context(), "slow-1"), cc, methodCharge, 20) }()
		a.waitStarted(t)
		dup := call(withKey(t.Context(), "slow-1"), cc, methodCharge, 20)
		checkStatus(t, dup, codes.Unavailable, idemgrpc.ReasonInFlight)
		if d := retryInfo(t, dup); d != 300*time.Millisecond {
			t.Fatalf("RetryInfo %v, want RetryAfter", d)
		}
		first := <-firstDone
		again := call(withKey(t.Context(), "slow-1"), cc, methodCharge, 20)
		if first.status.Code() != codes.OK || !again.replayed {
			t.Fatalf("first %v, again %v", first, again)
		}
		if err := sameAnswers([]result{first, again}); err != nil {
			t.Fatal(err)
		}
		seen := a.provider.seen()
		if len(seen) != 1 {
			t.Fatalf("the provider saw %q; want one call", seen)
		}
		if id := first.reply.GetFields()["id"].GetStringValue(); id != a.provider.charges[seen[0]] {
			t.Fatalf("reply id %q, provider's charge %q", id, a.provider.charges[seen[0]])
		}
		if got := e.rows(a.biz, "slow-1"); got != 1 {
			t.Fatalf("%d rows, want 1", got)
		}
	})
}

// recovering is a recovery interceptor, outside idem's, as services
// install one: a panic becomes INTERNAL.
func recovering(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (reply any, err error) {
	defer func() {
		if p := recover(); p != nil {
			reply, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return handler(ctx, req)
}

// A handler that panics rolls back and stores nothing (in ModeClaim its
// claim is released), and the panic goes on to the recovery interceptor:
// the retry runs again at once.
func TestHandlerPanics(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
			t.Run(modeName(mode), func(t *testing.T) {
				a := e.api()
				a.provider = &provider{}
				a.hook = func(ctx context.Context, run int64) error {
					req, _ := idemgrpc.RequestFrom(ctx)
					if err := e.insert(ctx, a.biz, req.Key, "panicked", 0); err != nil {
						return err
					}
					if run == 1 {
						panic("the handler's bug")
					}
					return nil
				}
				srv, _ := e.serveIdem(idemgrpc.Config{Mode: mode}, a, recovering)
				cc := dial(t, srv.addr)
				if r := call(withKey(t.Context(), "panic-1"), cc, methodCharge, 1); r.status.Code() != codes.Internal {
					t.Fatalf("first call: %v, want the recovered INTERNAL", r)
				}
				if got := e.rows(a.biz, "panic-1"); got != 0 {
					t.Fatalf("%d rows after the panic, want 0", got)
				}
				if r := call(withKey(t.Context(), "panic-1"), cc, methodCharge, 1); r.status.Code() != codes.OK || r.replayed {
					t.Fatalf("the retry got %v, want a fresh OK", r)
				}
			})
		}
	})
}

// In ModeClaim a call that runs past its lease is taken over by a retry;
// its own completion is fenced out and answered UNAVAILABLE (taken over),
// and a retry after that replays the result of the call that took over.
func TestClaimLeaseLost(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		a := e.api()
		a.provider = &provider{}
		a.started = make(chan struct{}, 10)
		a.overrun = true
		a.hook = func(_ context.Context, run int64) error {
			if run == 1 {
				time.Sleep(2500 * time.Millisecond) // past the lease, ignoring the deadline
			}
			return nil
		}
		s := e.store(idem.WithLease(time.Second))
		srv, _ := e.serveIdem(idemgrpc.Config{Mode: idemserve.ModeClaim, Store: s}, a)
		cc := dial(t, srv.addr)
		firstDone := make(chan result, 1)
		go func() { firstDone <- call(withKey(t.Context(), "over-1"), cc, methodCharge, 2) }()
		a.waitStarted(t)
		time.Sleep(1500 * time.Millisecond)
		second := call(withKey(t.Context(), "over-1"), cc, methodCharge, 2)
		first := <-firstDone
		if second.status.Code() != codes.OK || second.replayed {
			t.Fatalf("the call that took over got %v", second)
		}
		checkStatus(t, first, codes.Unavailable, idemgrpc.ReasonLeaseLost)
		again := call(withKey(t.Context(), "over-1"), cc, methodCharge, 2)
		if !again.replayed {
			t.Fatalf("a retry got %v, want the replay", again)
		}
		if err := sameAnswers([]result{second, again}); err != nil {
			t.Fatal(err)
		}
		if got := e.rows(a.biz, "over-1"); got != 1 {
			t.Fatalf("%d rows, want 1", got)
		}
	})
}

// Duplicates of a slow call wait in the process, not on pooled
// connections: with a pool of 4 and 12 duplicates of a 1 s call, no call
// waits for a connection, a call with another key is served without
// waiting for the slow one, and every duplicate replays its answer.
func TestDuplicatesWaitInMemory(t *testing.T) {
	const dups = 12
	forEachDB(t, func(t *testing.T, e *env) {
		db := e.open(4)
		a := e.api()
		a.started = make(chan struct{}, dups+1)
		a.hook = func(ctx context.Context, _ int64) error {
			if req, _ := idemgrpc.RequestFrom(ctx); req.Key == "slow-1" {
				time.Sleep(time.Second)
			}
			return nil
		}
		srv, _ := e.serveIdem(idemgrpc.Config{Runner: db.runner(nil)}, a)
		cc := dial(t, srv.addr)
		var rs []result
		done := make(chan struct{})
		go func() { defer close(done); rs = storm(t.Context(), cc, dups, "slow-1") }()
		a.waitStarted(t)
		time.Sleep(100 * time.Millisecond) // the duplicates are queued by now
		start := time.Now()
		if r := call(withKey(t.Context(), "quick-1"), cc, methodCharge, 1); r.status.Code() != codes.OK {
			t.Fatalf("another key: %v", r)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("a call with another key took %v behind the duplicates; want it served at once", took)
		}
		<-done
		if w := db.waits(); w != 0 {
			t.Fatalf("%d calls waited for one of the pool's 4 connections; duplicates must wait in memory", w)
		}
		checkStorm(t, rs, dups)
		if got := e.rows(a.biz, "slow-1"); got != 1 {
			t.Fatalf("%d rows, want 1", got)
		}
	})
}

// An attempt grpc-go's retry policy sends again (numbered in
// grpc-previous-rpc-attempts) reads its key's record before it claims the
// key, at an instance that has not served the key too. Seen on
// PostgreSQL, whose plain read waits for no row lock: while a transaction
// holds the completed record deleted but not committed, the numbered
// attempt replays at once, where a first attempt waits for that
// transaction in its claim, and replays once it rolls back.
func TestRetriedAttemptReadsFirst(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		if e.dialect != idem.Postgres {
			t.Skip("a locking read (MySQL's) waits for the held record either way")
		}
		a := e.api()
		s := e.store()
		first, _ := e.serveIdem(idemgrpc.Config{Store: s}, a)
		ctx := t.Context()
		if r := call(withKey(ctx, "retried-1"), dial(t, first.addr), methodCharge, 4); r.status.Code() != codes.OK {
			t.Fatalf("first call: %v", r)
		}
		instance := func() *grpc.ClientConn {
			srv, _ := e.serveIdem(idemgrpc.Config{Store: e.also(s), Runner: e.open(0).runner(nil)}, a)
			return dial(t, srv.addr)
		}
		holder, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if _, err := holder.ExecContext(ctx, "DELETE FROM "+s.Table()+" WHERE idem_key = $1", "retried-1"); err != nil {
			t.Fatal(err)
		}
		retry := metadata.AppendToOutgoingContext(withKey(ctx, "retried-1"), "grpc-previous-rpc-attempts", "1")
		if r := call(retry, instance(), methodCharge, 4); r.status.Code() != codes.OK || !r.replayed {
			t.Fatalf("a retried attempt beside the held record: %v; want the replay at once", r)
		}
		firstAttempt := make(chan result, 1)
		go func() { firstAttempt <- call(withKey(ctx, "retried-1"), instance(), methodCharge, 4) }()
		select {
		case r := <-firstAttempt:
			t.Fatalf("a first attempt answered beside the held record (%v): it did not claim first", r)
		case <-time.After(300 * time.Millisecond):
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}
		if r := <-firstAttempt; r.status.Code() != codes.OK || !r.replayed {
			t.Fatalf("the first attempt after the holder rolled back: %v; want the replay", r)
		}
		if got := e.rows(a.biz, "retried-1"); got != 1 || a.calls.Load() != 1 {
			t.Fatalf("%d rows, handler ran %d times; want 1 and 1", got, a.calls.Load())
		}
	})
}

// A call whose stored answer is sealed with a key this server lacks is
// INTERNAL with reason ReasonUnsealable, whose message says a retry will
// not succeed (never "retry with the same idempotency key"); the handler
// does not run again.
func TestUnopenableAnswer(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		sealer := func(id string) idem.Sealer {
			s, err := idem.NewAESGCMSealer(id, map[string][]byte{id: []byte(strings.Repeat(id[1:], 32))})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		a := e.api()
		a.provider = &provider{}
		store := e.store(idem.WithSealer(sealer("k1")))
		before, _ := e.serveIdem(idemgrpc.Config{Store: store}, a)
		if r := call(withKey(t.Context(), "sealed-1"), dial(t, before.addr), methodCharge, 1); r.status.Code() != codes.OK {
			t.Fatalf("first call: %v", r)
		}
		after, _ := e.serveIdem(idemgrpc.Config{Store: e.also(store, idem.WithSealer(sealer("k2")))}, a)
		r := call(withKey(t.Context(), "sealed-1"), dial(t, after.addr), methodCharge, 1)
		var reason string
		for _, d := range r.status.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.Reason
			}
		}
		if r.status.Code() != codes.Internal || reason != idemgrpc.ReasonUnsealable || !strings.Contains(r.status.Message(), "will not succeed") ||
			strings.Contains(r.status.Message(), "retry with the same") {
			t.Errorf("a replay sealed with a missing key: %v (reason %q); want INTERNAL %s saying a retry will not succeed", r, reason, idemgrpc.ReasonUnsealable)
		}
		if n := a.calls.Load(); n != 1 {
			t.Errorf("the handler ran %d times, want 1", n)
		}
	})
}

// With Standbys, a call whose commit has not reached the standbys in
// StandbyWait (none stream from the test's server, and it asks for 50)
// is UNAVAILABLE with RetryInfo, reason IDEMPOTENCY_NOT_REPLICATED, and
// so is its replay, in both modes; the handler ran once and its row
// stands. MariaDB
// refuses the option, naming semi-synchronous replication.
func TestNotReplicated(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		cfg := idemgrpc.Config{Standbys: 50, StandbyWait: 50 * time.Millisecond, RetryAfter: 2 * time.Second}
		if e.dialect != idem.Postgres {
			cfg.Store, cfg.Runner, cfg.Scope = e.store(), e.proc.runner(nil), byCaller
			if _, err := idemgrpc.New(cfg); err == nil || !strings.Contains(err.Error(), "rpl_semi_sync_master_enabled") {
				t.Fatalf("%s: %v, want a refusal naming semi-synchronous replication", e.name, err)
			}
			return
		}
		// With a replay cache too: the committed answer enters the cache,
		// and its replay from there must wait for the standbys as well.
		for _, cached := range []bool{false, true} {
			for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
				a := e.api()
				a.provider = &provider{}
				cfg.Mode, cfg.Store = mode, nil
				if cached {
					cfg.Store = e.store(idem.WithReplayCache(idem.ReplayCache{MaxEntries: 16}))
				}
				srv, _ := e.serveIdem(cfg, a)
				cc := dialBare(t, srv.addr)
				for attempt := range 2 {
					r := call(withKey(t.Context(), "unreplicated-1"), cc, methodCharge, 1)
					checkStatus(t, r, codes.Unavailable, idemgrpc.ReasonNotReplicated)
					if d := retryInfo(t, r); d != 2*time.Second {
						t.Errorf("%s (cached %v), attempt %d: RetryInfo %v, want 2s", modeName(mode), cached, attempt, d)
					}
				}
				if got := e.rows(a.biz, "unreplicated-1"); got != 1 || a.calls.Load() != 1 {
					t.Fatalf("%s (cached %v): %d rows and %d runs, want 1 and 1: the answer is withheld, not the commit", modeName(mode), cached, got, a.calls.Load())
				}
			}
		}
	})
}

// A method's key memory (Config.KeyMemory) is kept by its records: past
// the method's retention, a retry is refused as an expired key
// (FAILED_PRECONDITION) and the handler does not run, though the Store
// keeps no key memory and purged the record meanwhile; the refusal's
// ErrorInfo carries the reference the first call recorded
// (Config.Reference), which the purge kept.
func TestKeyMemoryPerMethod(t *testing.T) {
	forEachDB(t, func(t *testing.T, e *env) {
		const retention = 200 * time.Millisecond
		a := e.api()
		srv, s := e.serveIdem(idemgrpc.Config{
			Retention: func(string) time.Duration { return retention },
			KeyMemory: func(method string) time.Duration {
				if method == methodCharge {
					return time.Hour
				}
				return 0
			},
			Reference: func(method string, reply any) string {
				return "charges/" + reply.(*structpb.Struct).GetFields()["id"].GetStringValue()
			},
		}, a)
		cc := dial(t, srv.addr)
		ctx := withKey(t.Context(), "remembered-1")
		first := call(ctx, cc, methodCharge, 40)
		if first.status.Code() != codes.OK {
			t.Fatalf("the first call: %v", first.status)
		}
		id := first.reply.GetFields()["id"].GetStringValue()
		time.Sleep(retention + 100*time.Millisecond)
		if _, err := s.Purge(t.Context(), e.db, 10); err != nil {
			t.Fatal(err)
		}
		info := checkStatus(t, call(ctx, cc, methodCharge, 40), codes.FailedPrecondition, idemgrpc.ReasonExpired)
		if got := info.GetMetadata()["reference"]; id == "" || got != "charges/"+id {
			t.Errorf("the refusal's ErrorInfo names reference %q, want %q", got, "charges/"+id)
		}
		if got := e.rows(a.biz, "remembered-1"); got != 1 || a.calls.Load() != 1 {
			t.Fatalf("%d rows, the handler ran %d times; want once", got, a.calls.Load())
		}
	})
}
