package idemgrpc_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemserve"
)

// orders implements the examples' service (Charge; Refund and Get are
// not used) on SQLite. A real service would run on PostgreSQL or MySQL.
type orders struct{ charge func(key string) string }

// Charge writes its row through idemgrpc.TxFrom: the interceptor stores
// its answer with the caller's key in the same transaction.
func (o orders) Charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	ref := ""
	if claim := idemgrpc.ClaimFrom(ctx); claim != nil { // ModeClaim: no transaction is open yet
		ref = o.charge(claim.RelayKey())
	}
	tx := idemgrpc.TxFrom(ctx) // in ModeClaim, begins the transaction now
	if tx == nil {
		return nil, status.Error(codes.Unavailable, "database unavailable") // not stored: a retry runs again
	}
	res, err := tx.ExecContext(ctx, "INSERT INTO orders (item, ref) VALUES (?, ?)", in.GetFields()["item"].GetStringValue(), ref)
	if err != nil {
		return nil, status.Error(codes.Internal, "try again") // rolled back; a retry runs again
	}
	id, _ := res.LastInsertId()
	return structpb.NewStruct(map[string]any{"id": float64(id), "ref": ref})
}

func (orders) Refund(context.Context, *structpb.Struct) (*structpb.Struct, error) {
	return nil, status.Error(codes.Unimplemented, "no refunds")
}

func (orders) Get(context.Context, *wrapperspb.StringValue) (*structpb.Struct, error) {
	return nil, status.Error(codes.Unimplemented, "no reads")
}

// openSQLite opens a SQLite database in a fresh directory, with idem's
// table and an orders table.
func openSQLite() (db *sql.DB, store *idem.Store, cleanup func()) {
	dir, err := os.MkdirTemp("", "idemgrpc-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	if store, err = idem.New(idem.SQLite); err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, ref TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	return db, store, func() { db.Close(); os.RemoveAll(dir) }
}

// account is the examples' Config.Scope: the caller an authentication
// interceptor before this one found (here the account metadata, unchecked).
func account(ctx context.Context, _ any) (string, error) {
	if v := metadata.ValueFromIncomingContext(ctx, "account"); len(v) == 1 {
		return "account:" + v[0], nil
	}
	return "", status.Error(codes.Unauthenticated, "log in")
}

// listen serves svc behind the interceptor on a loopback port and returns
// a client connection whose calls carry a key, and a function that stops
// both.
func listen(in *idemgrpc.Interceptor, svc chargesServer) (*grpc.ClientConn, func()) {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(in.Unary()))
	srv.RegisterService(&chargesDesc, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	return conn, func() { conn.Close(); srv.Stop() }
}

// order sends the same order twice with one key, as a client retrying
// after a lost answer would, and prints the answers.
func order(conn *grpc.ClientConn) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "alice")
	in, _ := structpb.NewStruct(map[string]any{"item": "book"})
	var key string // the interceptor fills it in on the first call, and sends it again on the second
	for range 2 {
		reply, trailer := &structpb.Struct{}, metadata.MD{}
		if err := conn.Invoke(ctx, "/idemgrpc.test.Charges/Charge", in, reply, idemgrpc.UseKey(&key), grpc.Trailer(&trailer)); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("order %v ref %q replayed=%q\n", reply.GetFields()["id"].GetNumberValue(), reply.GetFields()["ref"].GetStringValue(), trailer.Get(idemgrpc.MetadataReplayed))
	}
}

// The handler writes its rows through idemgrpc.TxFrom; the interceptor
// stores its answer with the caller's key in the same transaction, and
// replays it for the caller's retry without running the handler again.
func Example() {
	db, store, cleanup := openSQLite()
	defer cleanup()
	in, err := idemgrpc.New(idemgrpc.Config{Store: store, DB: db, Scope: account, Required: true})
	if err != nil {
		log.Fatal(err)
	}
	conn, stop := listen(in, orders{})
	defer stop()

	order(conn)
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// order 1 ref "" replayed=[]
	// order 1 ref "" replayed=["true"]
	// orders: 1
}

// In ModeClaim the handler calls a slow provider with no transaction
// open, passing the claim's RelayKey as the provider's own idempotency
// key, then writes its rows through idemgrpc.TxFrom, which begins the
// transaction in which the interceptor completes the claim.
func ExampleClaimFrom() {
	db, store, cleanup := openSQLite()
	defer cleanup()
	in, err := idemgrpc.New(idemgrpc.Config{Store: store, DB: db, Scope: account, Mode: idemserve.ModeClaim, Required: true})
	if err != nil {
		log.Fatal(err)
	}
	// A payment provider's API, idempotent by its own key.
	calls, charges := 0, map[string]string{}
	charge := func(key string) string {
		calls++
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		return charges[key]
	}
	conn, stop := listen(in, orders{charge: charge})
	defer stop()

	order(conn)
	fmt.Println("provider calls:", calls)
	// Output:
	// order 1 ref "ch_1" replayed=[]
	// order 1 ref "ch_1" replayed=["true"]
	// provider calls: 1
}
