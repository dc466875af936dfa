package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
)

// TestSealCost measures what sealing responses at rest costs a fresh Do
// (idem.WithSealer with NewAESGCMSealer): a sealing Store and a plain one
// run fresh Do on the same table at the same time, 8 workers each, with
// a response body of 1 KiB, then of 64 KiB, in IDEM_SEAL_ROUNDS rounds
// (default 5) of IDEM_SEAL_RUN each (default 3s), and it logs the median
// of the sealed Store's rate over the plain one's in each round, and each
// round's. Side by side, both meet the same load from outside (a
// checkpoint, the disk's writes of a 64 KiB body), which runs in turn
// measured as much as sealing. Each size runs with two bodies: JSON text,
// which the database compresses when it stores a large value
// (PostgreSQL's TOAST; InnoDB's off-page columns do not), and random
// bytes, which nothing compresses: a sealed body is as random, so the
// first shows what sealing costs in storage, the second what it costs in
// work. It is a measurement, so it runs only with IDEM_BENCH_SEAL=1;
// docs/benchmarks.md quotes it.
//
//	IDEM_BENCH_SEAL=1 go test -run TestSealCost -v ./internal/bench
func TestSealCost(t *testing.T) {
	if os.Getenv("IDEM_BENCH_SEAL") != "1" {
		t.Skip("set IDEM_BENCH_SEAL=1 to measure the cost of sealing (a minute per driver)")
	}
	rounds := envInts(t, "IDEM_SEAL_ROUNDS", []int{5})[0]
	run := envDuration(t, "IDEM_SEAL_RUN", 3*time.Second)
	const workers = 8 // a side
	sealer, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		t.Run(tg.driver, func(t *testing.T) {
			ctx := context.Background()
			e := seeded(t, tg.open(t), tg.dialect, 1)
			sealed, err := idem.New(tg.dialect, idem.WithTable(e.store.Table()), idem.WithSealer(sealer))
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "body\t\tplain/s\tsealed/s\tsealed/plain\trounds\t")
			for _, b := range []struct {
				size int
				kind string
			}{{1 << 10, "json"}, {1 << 10, "random"}, {64 << 10, "json"}, {64 << 10, "random"}} {
				body := sealBody(b.size, b.kind)
				fresh := func(s *idem.Store) path {
					return path{name: "fresh", worker: func(e *Env, _ int) func(context.Context) error {
						return func(ctx context.Context) error { return e.freshWith(ctx, s, body) }
					}}
				}
				var plainRates, sealedRates, ratios []float64
				for r := range rounds + 1 {
					// The first round warms the pool and the caches, and is
					// not counted.
					rates, err := measureTogether(ctx, e, []path{fresh(e.store), fresh(sealed)}, workers, run)
					if err != nil {
						t.Fatal(err)
					}
					if r == 0 {
						continue
					}
					plainRates, sealedRates = append(plainRates, rates[0]), append(sealedRates, rates[1])
					ratios = append(ratios, rates[1]/rates[0])
				}
				each := make([]string, len(ratios))
				for i, r := range ratios {
					each[i] = fmt.Sprintf("%.2f", r)
				}
				fmt.Fprintf(tw, "%d KiB\t%s\t%.0f\t%.0f\t%.2f\t%s\t\n", b.size>>10, b.kind, median(plainRates), median(sealedRates), median(ratios), strings.Join(each, " "))
			}
			_ = tw.Flush()
			t.Logf("fresh Do through %s, %d workers a Store, side by side, %d rounds of %v, median:\n%s", tg.driver, workers, rounds, run, out.String())
		})
	}
}

// sealBody is a response body of size bytes: JSON text of orders, or
// random bytes.
func sealBody(size int, kind string) []byte {
	if kind == "random" {
		b := make([]byte, size)
		_, _ = rand.Read(b)
		return b
	}
	var b bytes.Buffer
	b.WriteString(`{"orders":[`)
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, `{"id":"ord_%08d","amount":%d,"currency":"EUR","status":"created","customer":"cus_%06d"},`, i*7919, 100+i*37%9000, i*104729%1000000)
	}
	return b.Bytes()[:size]
}

// freshWith is Fresh through s, with body as the response's.
func (e *Env) freshWith(ctx context.Context, s *idem.Store, body []byte) error {
	key := e.Key()
	return e.tx(ctx, func(tx *sql.Tx) error {
		res, err := s.Do(ctx, tx, Request(key), func(ctx context.Context) (idem.Response, error) {
			return idem.Response{StatusCode: 201, Body: body}, e.order(ctx, tx, key)
		})
		if err == nil && (res.Replayed || !slices.Equal(res.Body, body)) {
			err = fmt.Errorf("bench: key %q: replayed=%v, %d bytes; want a fresh Do of %d", key, res.Replayed, len(res.Body), len(body))
		}
		return err
	})
}
