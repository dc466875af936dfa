package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/idemtest/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The test service, declared by hand as grpc-go's generated code would
// declare it, with well-known types as its messages: Charge and Refund
// write a row per call, Get reads.
const (
	methodCharge = "/idemgrpc.test.Charges/Charge"
	methodRefund = "/idemgrpc.test.Charges/Refund"
	methodGet    = "/idemgrpc.test.Charges/Get"
)

type chargesServer interface {
	Charge(context.Context, *structpb.Struct) (*structpb.Struct, error)
	Refund(context.Context, *structpb.Struct) (*structpb.Struct, error)
	Get(context.Context, *wrapperspb.StringValue) (*structpb.Struct, error)
}

var chargesDesc = grpc.ServiceDesc{
	ServiceName: "idemgrpc.test.Charges",
	HandlerType: (*chargesServer)(nil),
	Methods: []grpc.MethodDesc{
		unary("Charge", chargesServer.Charge),
		unary("Refund", chargesServer.Refund),
		unary("Get", chargesServer.Get),
	},
	Metadata: "env_test.go",
}

// unary is the grpc.MethodDesc of the method name of srv, as protoc-gen-go-grpc writes it.
func unary[Req proto.Message](name string, call func(chargesServer, context.Context, Req) (*structpb.Struct, error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		var zero Req
		in := zero.ProtoReflect().New().Interface().(Req)
		if err := dec(in); err != nil {
			return nil, err
		}
		handler := func(ctx context.Context, req any) (any, error) { return call(srv.(chargesServer), ctx, req.(Req)) }
		if interceptor == nil {
			return handler(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/idemgrpc.test.Charges/" + name}, handler)
	}}
}

// env is one database server through one driver: database/sql, or pgx
// natively (the interceptor on an idempgx Runner, the handler's
// transaction a pgx.Tx). db is a database/sql pool of the test's for
// setting up and checking, on every target.
type env struct {
	t       *testing.T
	name    string
	dialect idem.Dialect
	driver  string
	native  bool
	dsn     string
	db      *sql.DB
	proc    *process // the pool the interceptors of serveIdem run on
}

// forEachDB runs f on PostgreSQL through database/sql (pgx's driver) and
// through pgx itself, and on MariaDB (go-sql-driver), in parallel.
func forEachDB(t *testing.T, f func(t *testing.T, e *env)) {
	t.Parallel()
	for _, s := range []struct {
		name    string
		server  *testdb.Server
		driver  string
		dialect idem.Dialect
		native  bool
	}{
		{"postgres", testdb.Postgres, "pgx", idem.Postgres, false},
		{"postgres-pgxnative", testdb.Postgres, "pgx", idem.Postgres, true},
		{"mariadb", testdb.MariaDB, "mysql", idem.MariaDB, false},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			e := &env{t: t, name: s.name, dialect: s.dialect, driver: s.driver, native: s.native, dsn: s.server.DSN(t)}
			db, err := sql.Open(e.driver, e.dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			e.db = db
			e.proc = e.open(0)
			f(t, e)
		})
	}
}

// process is the connection pool of one process of the service: a
// *sql.DB, or on the native target a *pgxpool.Pool.
type process struct {
	db  *sql.DB
	pgx *pgxpool.Pool
}

// open opens a pool of its own on the server, of at most conns
// connections (0: the driver's default), closed when the test ends:
// another process's.
func (e *env) open(conns int) *process {
	e.t.Helper()
	if e.native {
		cfg, err := pgxpool.ParseConfig(e.dsn)
		if err != nil {
			e.t.Fatal(err)
		}
		if conns > 0 {
			cfg.MaxConns = int32(conns)
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(p.Close)
		return &process{pgx: p}
	}
	db, err := sql.Open(e.driver, e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	e.t.Cleanup(func() { db.Close() })
	return &process{db: db}
}

// runner is the process's pool as an interceptor's Runner, its
// transactions begun with opts.
func (p *process) runner(opts *sql.TxOptions) idem.Runner {
	if p.pgx == nil {
		return idem.NewSQLRunner(p.db, opts)
	}
	var po pgx.TxOptions
	if opts != nil && opts.Isolation == sql.LevelSerializable {
		po.IsoLevel = pgx.Serializable
	}
	return idempgx.New(p.pgx, po)
}

// close closes the pool: the process is gone.
func (p *process) close() {
	if p.pgx != nil {
		p.pgx.Close()
		return
	}
	_ = p.db.Close()
}

// waits is how many times a request for one of the pool's connections
// waited for another to be released. A *pgxpool.Pool counts the acquires
// that found no idle connection, whether they waited for a release or
// opened a new one, and counts the new ones: the difference is the waits.
func (p *process) waits() int64 {
	if p.pgx != nil {
		st := p.pgx.Stat()
		return st.EmptyAcquireCount() - st.NewConnsCount()
	}
	return p.db.Stats().WaitCount
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// store makes a Store on a table of its own, dropped when the test ends.
func (e *env) store(opts ...idem.Option) *idem.Store {
	e.t.Helper()
	table := randName("idemgrpc")
	s, err := idem.New(e.dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), e.db); err != nil {
		e.t.Fatal(err)
	}
	e.dropLater(table)
	return s
}

// also is another Store on s's table, as another process has.
func (e *env) also(s *idem.Store, opts ...idem.Option) *idem.Store {
	o, err := idem.New(e.dialect, append([]idem.Option{idem.WithTable(s.Table())}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// business makes a table of business rows, one per charge, dropped when
// the test ends. It has no unique key, so that a second charge would
// show as a second row.
func (e *env) business() string {
	e.t.Helper()
	table := randName("charges")
	if _, err := e.db.Exec(fmt.Sprintf("CREATE TABLE %s (k VARCHAR(255) NOT NULL, id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)", table)); err != nil {
		e.t.Fatal(err)
	}
	e.dropLater(table)
	return table
}

func (e *env) dropLater(table string) {
	e.t.Cleanup(func() {
		if _, err := e.db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
			e.t.Errorf("drop %s: %v", table, err)
		}
	})
}

// rows counts the business rows of key.
func (e *env) rows(biz, key string) int {
	e.t.Helper()
	q := fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE k = $1", biz)
	if e.dialect != idem.Postgres {
		q = fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE k = ?", biz)
	}
	var n int
	if err := e.db.QueryRow(q, key).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// hasTx reports whether the handler whose context is ctx has a
// transaction, through its driver's TxFrom.
func (e *env) hasTx(ctx context.Context) bool {
	if e.native {
		return idempgx.TxFrom(ctx) != nil
	}
	return idemgrpc.TxFrom(ctx) != nil
}

// errNoTx is the handlers' error when TxFrom gave them no transaction.
var errNoTx = errors.New("no transaction")

// insert writes a business row through the transaction of the handler
// whose context is ctx.
func (e *env) insert(ctx context.Context, biz, key, id string, amount int64) error {
	if e.native {
		tx := idempgx.TxFrom(ctx)
		if tx == nil {
			return errNoTx
		}
		_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (k, id, amount) VALUES ($1, $2, $3)", biz), key, id, amount)
		return err
	}
	tx := idemgrpc.TxFrom(ctx)
	if tx == nil {
		return errNoTx
	}
	q := fmt.Sprintf("INSERT INTO %s (k, id, amount) VALUES ($1, $2, $3)", biz)
	if e.dialect != idem.Postgres {
		q = fmt.Sprintf("INSERT INTO %s (k, id, amount) VALUES (?, ?, ?)", biz)
	}
	_, err := tx.ExecContext(ctx, q, key, id, amount)
	return err
}

// sessionID is the database session of the transaction of the handler
// whose context is ctx.
func (e *env) sessionID(ctx context.Context) (int64, error) {
	var id int64
	if e.native {
		tx := idempgx.TxFrom(ctx)
		if tx == nil {
			return 0, errNoTx
		}
		err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&id)
		return id, err
	}
	tx := idemgrpc.TxFrom(ctx)
	if tx == nil {
		return 0, errNoTx
	}
	q := "SELECT pg_backend_pid()"
	if e.dialect != idem.Postgres {
		q = "SELECT CONNECTION_ID()"
	}
	err := tx.QueryRowContext(ctx, q).Scan(&id)
	return id, err
}

// kill ends the session id, as the crash of its process would.
func (e *env) kill(id int64) error {
	var err error
	if e.dialect == idem.Postgres {
		_, err = e.db.Exec("SELECT pg_terminate_backend($1)", id)
	} else {
		_, err = e.db.Exec(fmt.Sprintf("KILL %d", id))
	}
	return err
}

// provider is a payment provider that deduplicates on its own key, as
// Stripe does: a call with a key it has seen answers the first charge.
type provider struct {
	delay   time.Duration
	mu      sync.Mutex
	charges map[string]string // relay key → charge id
	calls   []string          // the relay key of each call
}

func (p *provider) charge(ctx context.Context, key string) (string, error) {
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, key)
	if p.charges == nil {
		p.charges = map[string]string{}
	}
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	p.charges[key] = randName("ch")
	return p.charges[key], nil
}

func (p *provider) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// api implements the test service. Charge writes one row through TxFrom
// and answers its id; in ModeClaim it first charges the provider with
// the claim's RelayKey, with no transaction open.
type api struct {
	e        *env
	biz      string
	delay    time.Duration                              // before the row is written
	provider *provider                                  // ModeClaim
	calls    atomic.Int64                               // handler runs
	started  chan struct{}                              // when set, gets a value as each run starts
	hook     func(ctx context.Context, run int64) error // when set, runs before the row (run counts from 1); an error is answered
	// overrun makes the first run write its row past its context's end,
	// as a handler that ignores its deadline (or a process that stalled)
	// would.
	overrun bool
}

func (e *env) api() *api { return &api{e: e, biz: e.business()} }

// waitStarted waits until a run of a's handler starts (a.started), and
// fails t, instead of hanging the suite, when none starts within 30 s:
// the call that should have run failed before it.
func (a *api) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-a.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no run of the handler started within 30 s")
	}
}

func (a *api) Charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	run := a.calls.Add(1)
	if a.started != nil {
		a.started <- struct{}{}
	}
	req, _ := idemgrpc.RequestFrom(ctx)
	id := randName("row")
	if claim := idemgrpc.ClaimFrom(ctx); claim != nil {
		var err error
		if id, err = a.provider.charge(ctx, claim.RelayKey()); err != nil {
			return nil, status.Errorf(codes.Unavailable, "provider: %v", err)
		}
	}
	select {
	case <-time.After(a.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if a.hook != nil {
		if err := a.hook(ctx, run); err != nil {
			return nil, err
		}
	}
	amount := int64(in.GetFields()["amount"].GetNumberValue())
	if a.overrun && run == 1 {
		ctx = context.WithoutCancel(ctx)
	}
	if err := a.e.insert(ctx, a.biz, req.Key, id, amount); err != nil {
		return nil, status.Errorf(codes.Internal, "insert: %v", err)
	}
	return structpb.NewStruct(map[string]any{"id": id, "amount": float64(amount), "key": req.Key})
}

func (a *api) Refund(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	return a.Charge(ctx, in)
}

func (a *api) Get(ctx context.Context, in *wrapperspb.StringValue) (*structpb.Struct, error) {
	_, keyed := idemgrpc.RequestFrom(ctx)
	return structpb.NewStruct(map[string]any{"id": in.GetValue(), "tx": a.e.hasTx(ctx), "keyed": keyed})
}

// logTo is a Logger for interceptors that writes to t's log, shown only
// when t fails: the tests provoke errors, and an INTERNAL answer is
// explained only there. What is logged once t has ended is dropped.
func logTo(t *testing.T) *slog.Logger {
	w := &testLog{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

// testLog writes to t's log until t ends.
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

// server is a gRPC server on a loopback port.
type server struct {
	addr string
	srv  *grpc.Server
	done chan struct{}
}

// serve starts a gRPC server for the service on addr ("127.0.0.1:0" for
// a free port), with the interceptors, stopped when the test ends.
func serve(t *testing.T, addr string, svc chargesServer, interceptors ...grpc.UnaryServerInterceptor) *server {
	t.Helper()
	return serveDesc(t, addr, &chargesDesc, svc, interceptors...)
}

// serveDesc is serve for the service desc implemented by svc.
func serveDesc(t *testing.T, addr string, desc *grpc.ServiceDesc, svc any, interceptors ...grpc.UnaryServerInterceptor) *server {
	t.Helper()
	var lis net.Listener
	var err error
	for range 50 { // a port just freed by Stop may take a moment
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: lis.Addr().String(), srv: grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...)), done: make(chan struct{})}
	s.srv.RegisterService(desc, svc)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis)
	}()
	t.Cleanup(s.stop)
	return s
}

// stop stops the server at once, as Stop does: connections are closed
// and handlers still running go on in the background.
func (s *server) stop() {
	s.srv.Stop()
	<-s.done
}

// serveIdem starts the service behind an interceptor of cfg, with e's
// pool and a new Store unless cfg has them.
func (e *env) serveIdem(cfg idemgrpc.Config, svc chargesServer, outer ...grpc.UnaryServerInterceptor) (*server, *idem.Store) {
	e.t.Helper()
	if cfg.Store == nil {
		cfg.Store = e.store()
	}
	if cfg.Runner == nil {
		cfg.Runner, cfg.TxOptions = e.proc.runner(cfg.TxOptions), nil
	}
	if cfg.Scope == nil {
		cfg.Scope = byCaller
	}
	if cfg.Logger == nil {
		cfg.Logger = logTo(e.t)
	}
	in, err := idemgrpc.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return serve(e.t, "127.0.0.1:0", svc, append(outer, in.Unary())...), cfg.Store
}

// byCaller is the tests' Config.Scope: the caller metadata, as an
// authentication interceptor would have checked it.
func byCaller(ctx context.Context, _ any) (string, error) {
	if v := metadata.ValueFromIncomingContext(ctx, "caller"); len(v) == 1 {
		return "caller:" + v[0], nil
	}
	return "", status.Error(codes.Unauthenticated, "no caller")
}

// retryPolicy is a service config whose retry policy retries UNAVAILABLE
// for every method, as docs/grpc.md recommends.
const retryPolicy = `{"methodConfig": [{"name": [{}], "retryPolicy": {
	"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
	"retryableStatusCodes": ["UNAVAILABLE"]}}]}`

// dial connects to addr through the client interceptor, closed when the
// test ends.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return dialBare(t, addr, append(opts, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))...)
}

// dialBare connects to addr without the client interceptor, closed when
// the test ends.
func dialBare(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// as is ctx with the caller metadata of the tests' Scope.
func as(ctx context.Context, caller string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "caller", caller)
}

// withKey is ctx of caller alice with key in the metadata.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(as(ctx, "alice"), idemgrpc.MetadataKey, key)
}

// result is what one call got.
type result struct {
	reply    *structpb.Struct
	status   *status.Status
	replayed bool
	header   metadata.MD
	trailer  metadata.MD
}

func (r result) String() string {
	if r.status.Code() != codes.OK {
		return fmt.Sprintf("%v %q", r.status.Code(), r.status.Message())
	}
	return fmt.Sprintf("OK %v (replayed %v)", r.reply.AsMap(), r.replayed)
}

// call invokes method with a Struct of amount.
func call(ctx context.Context, cc *grpc.ClientConn, method string, amount float64, opts ...grpc.CallOption) result {
	var r result
	r.reply = &structpb.Struct{}
	in, _ := structpb.NewStruct(map[string]any{"amount": amount})
	err := cc.Invoke(ctx, method, in, r.reply, append(opts, grpc.Header(&r.header), grpc.Trailer(&r.trailer))...)
	r.status = status.Convert(err)
	r.replayed = len(r.trailer.Get(idemgrpc.MetadataReplayed)) == 1 && r.trailer.Get(idemgrpc.MetadataReplayed)[0] == "true"
	if err != nil {
		r.reply = nil
	}
	return r
}

// retrying calls until an answer that is not UNAVAILABLE or
// DEADLINE_EXCEEDED, each attempt given attempt, at most 40 times, all
// with one key (UseKey): an application's retry loop. It returns the
// final answer and every answer that was OK.
func retrying(ctx context.Context, cc *grpc.ClientConn, key *string, amount float64, attempt, pause time.Duration) (final result, oks []result) {
	for range 40 {
		actx, cancel := context.WithTimeout(ctx, attempt)
		r := call(as(actx, "alice"), cc, methodCharge, amount, idemgrpc.UseKey(key))
		cancel()
		if r.status.Code() == codes.OK {
			oks = append(oks, r)
		}
		if c := r.status.Code(); c != codes.Unavailable && c != codes.DeadlineExceeded || ctx.Err() != nil {
			return r, oks
		}
		time.Sleep(pause)
	}
	return final, oks
}

// sameAnswers reports the first answer of rs that differs from the
// first, if any.
func sameAnswers(rs []result) error {
	for _, r := range rs {
		if !proto.Equal(r.reply, rs[0].reply) || !proto.Equal(r.status.Proto(), rs[0].status.Proto()) {
			return fmt.Errorf("answers differ: %v and %v", rs[0], r)
		}
	}
	if len(rs) == 0 {
		return errors.New("no answer")
	}
	return nil
}

// proxy is a TCP proxy to a server whose connections the test can cut.
type proxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target}
	go p.accept()
	t.Cleanup(func() { lis.Close(); p.cut() })
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() { _, _ = io.Copy(c, s); c.Close() }()
	}
}

// cut closes every connection through the proxy, both ways, as a network
// failure would; new connections go through.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
