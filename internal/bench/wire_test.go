package bench

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// wire is what a client sent to the server through a proxy: its protocol
// messages, read off the stream as they pass.
type wire struct {
	roundTrips atomic.Int64 // messages the client waits on: Sync and Query (PostgreSQL), every command but COM_STMT_CLOSE (MySQL)
	parses     atomic.Int64 // statements the server parses: Parse and Query (PostgreSQL), COM_STMT_PREPARE and COM_QUERY (MySQL)
	flushes    atomic.Int64 // reads of the client's socket: its writes, where the client waits between them
	bytes      atomic.Int64
}

type wireCount struct{ roundTrips, parses, flushes, bytes int64 }

func (w *wire) count() wireCount {
	return wireCount{w.roundTrips.Load(), w.parses.Load(), w.flushes.Load(), w.bytes.Load()}
}

func (c wireCount) minus(d wireCount) wireCount {
	return wireCount{c.roundTrips - d.roundTrips, c.parses - d.parses, c.flushes - d.flushes, c.bytes - d.bytes}
}

// proxy forwards connections from a local port to addr, counting what
// clients send in w; mysql says which protocol they speak.
func proxy(t *testing.T, addr string, mysql bool, w *wire) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
			wg.Go(func() { w.forward(s, c, mysql); _ = s.Close() })
		}
	})
	return ln.Addr().String()
}

// forward copies the client's stream to the server, counting its messages.
func (w *wire) forward(dst io.Writer, src io.Reader, mysql bool) {
	var pending []byte
	startup := true // PostgreSQL: untyped messages until the StartupMessage
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			w.flushes.Add(1)
			w.bytes.Add(int64(n))
			pending = append(pending, buf[:n]...)
			if mysql {
				pending = w.mysqlPackets(pending)
			} else {
				pending = w.pgMessages(pending, &startup)
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pgMessages counts the whole PostgreSQL messages at the start of b and
// returns the rest.
func (w *wire) pgMessages(b []byte, startup *bool) []byte {
	for {
		if *startup {
			if len(b) < 8 {
				return b
			}
			n := int(binary.BigEndian.Uint32(b))
			if len(b) < n {
				return b
			}
			// SSLRequest, GSSENCRequest and CancelRequest precede or
			// replace the StartupMessage.
			switch binary.BigEndian.Uint32(b[4:]) {
			case 80877103, 80877104, 80877102:
			default:
				*startup = false
			}
			b = b[n:]
			continue
		}
		if len(b) < 5 {
			return b
		}
		n := 1 + int(binary.BigEndian.Uint32(b[1:]))
		if len(b) < n {
			return b
		}
		switch b[0] {
		case 'S':
			w.roundTrips.Add(1)
		case 'Q':
			w.roundTrips.Add(1)
			w.parses.Add(1)
		case 'P':
			w.parses.Add(1)
		}
		b = b[n:]
	}
}

// mysqlPackets counts the commands among the whole MySQL packets at the
// start of b and returns the rest. A command is a packet of sequence 0.
func (w *wire) mysqlPackets(b []byte) []byte {
	for len(b) >= 4 {
		n := 4 + (int(b[0]) | int(b[1])<<8 | int(b[2])<<16)
		if len(b) < n {
			return b
		}
		if b[3] == 0 && n > 4 {
			switch b[4] {
			case 0x19, 0x01: // COM_STMT_CLOSE and COM_QUIT: no answer
			case 0x03, 0x16: // COM_QUERY, COM_STMT_PREPARE
				w.roundTrips.Add(1)
				w.parses.Add(1)
			default:
				w.roundTrips.Add(1)
			}
		}
		b = b[n:]
	}
	return b
}

// through opens tg's server through a counting proxy, on one connection.
func (tg target) through(t *testing.T, w *wire) *sql.DB {
	t.Helper()
	dsn := tg.server.DSN(t)
	if tg.driver == "mysql" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Addr = proxy(t, cfg.Addr, true, w)
		dsn = cfg.FormatDSN()
	} else {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = proxy(t, u.Host, false, w)
		dsn = u.String()
	}
	db, err := sql.Open(tg.driver, withParams(dsn))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestRoundTrips counts, on the wire, what one transaction of each path
// sends through each driver: the round trips it waits on (BEGIN and COMMIT
// included), the statements the server parses, the client's writes and
// its bytes. It checks only that the counting works; run it with -v for
// the table (docs/benchmarks.md). IDEM_BENCH_DSN_PARAMS applies, as in
// TestRun.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	for _, tg := range targets {
		t.Run(tg.driver, func(t *testing.T) {
			var w wire
			e := seeded(t, tg.through(t, &w), tg.dialect, 1)
			// A statement whose answer means the server has read all
			// that came before it, and what it sends itself.
			barrier := func() wireCount {
				if _, err := e.db.ExecContext(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				return w.count()
			}
			before := barrier()
			own := barrier().minus(before)
			var out strings.Builder
			tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "path\tround trips\tparsed\tclient writes\tbytes sent\t")
			const ops = 20
			trips := map[string]float64{}
			type counted struct {
				name string
				body func(context.Context) error
				warm int // transactions run before the counted ones
			}
			var bodies []counted
			for _, p := range paths {
				if !p.hot {
					// Twice, to fill the statement caches: a replay whose
					// key a later key pushed out of the Store's
					// completed-key hint claims and reads the first time,
					// and only from then on reads first, with a statement
					// of its own.
					bodies = append(bodies, counted{p.name, p.worker(e, 0), 2})
				}
			}
			// cross once its Store has replayed more keys it did not know
			// than it claimed fresh ones: on PostgreSQL it reads them first.
			bodies = append(bodies, counted{"cross, replaying", e.crossReplayer(0, false), 64})
			// A Store with WithLockTimeout, as docs/http.md and
			// docs/grpc.md advise in transaction mode.
			bounded, err := idem.New(tg.dialect, idem.WithTable(e.store.Table()), idem.WithLockTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			bodies = append(bodies,
				counted{"fresh, lock timeout", func(ctx context.Context) error { return e.doOn(ctx, bounded, e.Key(), false) }, 2},
				counted{"replay, lock timeout", func(ctx context.Context) error { return e.doOn(ctx, bounded, replayKey(0), true) }, 2})
			for _, p := range bodies {
				body := p.body
				for range p.warm {
					if err := body(ctx); err != nil {
						t.Fatal(err)
					}
				}
				start := barrier()
				for range ops {
					if err := body(ctx); err != nil {
						t.Fatal(err)
					}
				}
				c := barrier().minus(start).minus(own)
				if c.roundTrips <= 0 || c.flushes <= 0 {
					t.Errorf("%s: %+v counted for %d transactions", p.name, c, ops)
				}
				trips[p.name] = float64(c.roundTrips) / ops
				fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.0f\t\n", p.name, trips[p.name], float64(c.parses)/ops,
					float64(c.flushes)/ops, float64(c.bytes)/ops)
			}
			_ = tw.Flush()
			t.Logf("per transaction, %s:\n%s", tg.driver, out.String())
			if os.Getenv("IDEM_BENCH_DSN_PARAMS") != "" {
				return
			}
			// With each driver's default settings every statement of
			// idem's is one round trip (MySQL's and lib/pq's with their
			// arguments written into the text): a fresh Do adds its claim
			// and its response to the bare transaction's, a replay is
			// BEGIN, one read and COMMIT, a replay in another instance one
			// statement more, and a retry in another instance one read.
			// cross is a statement more only until its Store has seen
			// most of the keys it did not know replay, on PostgreSQL.
			// WithLockTimeout adds its statements to the claim: four on
			// PostgreSQL, where a replay's read first runs before them,
			// and three on MySQL, whose read first they bound too.
			replaying, bound, boundReplay := 3.0, 4.0, 3.0
			if tg.dialect != idem.Postgres {
				replaying, bound, boundReplay = 4, 3, 6
			}
			for path, want := range map[string]float64{"fresh": trips["bare"] + 2, "replay": 3, "cross": 4, "retry": 3, "cross, replaying": replaying,
				"fresh, lock timeout": trips["bare"] + 2 + bound, "replay, lock timeout": boundReplay} {
				if trips[path] != want {
					t.Errorf("%s: %.1f round trips a transaction, want %.1f", path, trips[path], want)
				}
			}
		})
	}
	t.Run("pgx-native", nativeRoundTrips)
}

// nativeRoundTrips is TestRoundTrips through pgx itself (idempgx, one
// pool connection): the hand-written transactions through pgx.BeginFunc;
// Do in a transaction of pgx's own (begintx), in one of idempgx.RunTx's,
// which sends BEGIN with the claim and COMMIT with the completion
// (pipelined), and through idemhttp's middleware on idempgx's Runner,
// which runs its handler's transactions as RunTx does, and on one that
// begins pgx's own.
func nativeRoundTrips(t *testing.T) {
	ctx := context.Background()
	tg := targets[0]
	var w wire
	u, err := url.Parse(tg.server.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy(t, u.Host, false, &w)
	cfg, err := pgxpool.ParseConfig(withParams(u.String()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := seeded(t, tg.open(t), tg.dialect, 1)
	today, pipelined := &native{e: e, pool: pool}, &native{e: e, pool: pool, pipelined: true}
	srv := pipelined.serveHTTP(t, 1)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	t.Cleanup(client.CloseIdleConnections)
	barrier := func() wireCount {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		return w.count()
	}
	before := barrier()
	own := barrier().minus(before)
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path	round trips	parsed	client writes	bytes sent	")
	const ops = 20
	trips := map[string]float64{}
	for _, p := range []struct {
		name string
		body func(context.Context) error
	}{
		{"bare", today.bare},
		{"floor", today.floor},
		{"read", func(ctx context.Context) error { return today.read(ctx, replayKey(0)) }},
		{"fresh begintx", func(ctx context.Context) error { return today.do(ctx, e.Key(), false) }},
		{"fresh pipelined", func(ctx context.Context) error { return pipelined.do(ctx, e.Key(), false) }},
		{"replay begintx", func(ctx context.Context) error { return today.do(ctx, replayKey(0), true) }},
		{"replay pipelined", func(ctx context.Context) error { return pipelined.do(ctx, replayKey(0), true) }},
		{"cross begintx", today.crossReplayer(0, false)},
		{"cross pipelined", pipelined.crossReplayer(0, false)},
		{"retry begintx", today.crossReplayer(0, true)},
		{"retry pipelined", pipelined.crossReplayer(0, true)},
		{"http fresh begintx", freshPath(viaBeginTx).sender(t, srv, client)},
		{"http fresh pipelined", freshPath(viaPipelined).sender(t, srv, client)},
		{"http cross begintx", crossPath(viaBeginTx).sender(t, srv, client)},
		{"http cross pipelined", crossPath(viaPipelined).sender(t, srv, client)},
	} {
		if p.name == "http cross begintx" { // the first to replay them
			if err := srv.seedCross(ctx, client, 1); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 { // fills pgx's statement cache, as in TestRoundTrips
			if err := p.body(ctx); err != nil {
				t.Fatal(err)
			}
		}
		start := barrier()
		for range ops {
			if err := p.body(ctx); err != nil {
				t.Fatal(err)
			}
		}
		c := barrier().minus(start).minus(own)
		trips[p.name] = float64(c.roundTrips) / ops
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.0f\t\n", p.name, trips[p.name], float64(c.parses)/ops,
			float64(c.flushes)/ops, float64(c.bytes)/ops)
	}
	_ = tw.Flush()
	t.Logf("per transaction, pgx itself:\n%s", out.String())
	if os.Getenv("IDEM_BENCH_DSN_PARAMS") != "" {
		return
	}
	// In a transaction of pgx's own every statement is a round trip, as
	// through database/sql. A pipelined one sends BEGIN with the claim,
	// and in READ COMMITTED the read of an existing record with them, and
	// the completion with COMMIT: a fresh Do costs no round trip more than
	// the bare transaction, a replay two (BEGIN with the read, COMMIT),
	// from another instance too, with the hint or without it.
	for path, want := range map[string]float64{
		"fresh begintx": trips["bare"] + 2, "replay begintx": 3, "cross begintx": 4, "retry begintx": 3,
		"fresh pipelined": trips["bare"], "replay pipelined": 2, "cross pipelined": 2, "retry pipelined": 2,
		"http fresh begintx": trips["bare"] + 2, "http cross begintx": 4,
		"http fresh pipelined": trips["bare"], "http cross pipelined": 2,
	} {
		if trips[path] != want {
			t.Errorf("%s: %.1f round trips a transaction, want %.1f", path, trips[path], want)
		}
	}
}
