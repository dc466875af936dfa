package bench

import (
	"cmp"
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunHTTP runs every HTTP path briefly through both handlers and
// checks the report's shape. With IDEM_BENCH set it runs the full
// measurement at 8 workers, RunHTTP's default (IDEM_BENCH_ROUNDS rounds,
// default 10), and prints it: the numbers of `idem bench --http`.
func TestRunHTTP(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.driver, func(t *testing.T) {
			cfg := HTTPConfig{DB: tg.open(t), Driver: tg.driver, Dialect: tg.dialect, Rounds: 2, Duration: 50 * time.Millisecond, Concurrency: []int{2}}
			if os.Getenv("IDEM_BENCH") != "" {
				rounds, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS"))
				cfg = HTTPConfig{DB: cfg.DB, Driver: tg.driver, Dialect: tg.dialect, Rounds: cmp.Or(rounds, 10), Concurrency: []int{8}}
			}
			var out strings.Builder
			rs, err := RunHTTP(context.Background(), cfg, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if want := len(httpPaths) * len(cfg.Concurrency); len(rs) != want {
				t.Fatalf("%d results, want %d", len(rs), want)
			}
			for _, r := range rs {
				if r.Middleware <= 0 || r.Bare <= 0 || r.Ratio <= 0 || len(r.Ratios) != cfg.Rounds || r.MiddlewareAllocs <= 0 || r.BareAllocs <= 0 {
					t.Errorf("%+v: want rates, a ratio per round and allocations measured", r)
				}
			}
		})
	}
}

// BenchmarkHTTP sends each HTTP path through idemhttp and through the bare
// handler, from 8 workers, with allocations per request (client and server
// together, in this process). It is what to profile the middleware with:
//
//	go test -run '^$' -bench 'BenchmarkHTTP/pgx/fresh' -benchtime 5000x -cpuprofile cpu.out -memprofile mem.out ./internal/bench
func BenchmarkHTTP(b *testing.B) {
	ctx := context.Background()
	for _, tg := range targets {
		b.Run(tg.driver, func(b *testing.B) {
			e := seeded(b, tg.open(b), tg.dialect, 0)
			srv, err := e.serveHTTP()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(srv.close)
			const conc = 8
			client := srv.client(conc)
			for _, p := range httpPaths {
				for _, h := range []string{middlewarePath, barePath} {
					if p.replay {
						for w := range conc {
							if err := send(ctx, client, srv.url+h, p.key(e, h, w), false); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.Run(p.name+strings.ReplaceAll(h, "/", "-"), func(b *testing.B) {
						b.ReportAllocs()
						var next atomic.Int64
						parallel(b, conc, func(int) func(context.Context) error {
							w := int(next.Add(1)-1) % conc
							return func(ctx context.Context) error { return send(ctx, client, srv.url+h, p.key(e, h, w), p.replay) }
						})
					})
				}
			}
		})
	}
}
