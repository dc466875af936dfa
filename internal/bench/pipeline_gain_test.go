package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// floorPipelined is the floor's transaction with its five statements in
// three round trips, written by hand on pgx: BEGIN in one batch with the
// claim, the order row on its own, the completion in one batch with
// COMMIT. It is the measurement of the pipelining issue (#34), which
// idempgx's pipelined transaction is built to reach.
func (n *native) floorPipelined(ctx context.Context) error {
	c, err := n.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	req := Request(n.e.Key())
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(n.e.floorClaim, req.Scope, req.Key, req.Operation, req.Fingerprint)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return rollback(conn, err)
	}
	if _, err := conn.Exec(ctx, n.e.insert, req.Key, 100); err != nil {
		return rollback(conn, err)
	}
	b = &pgx.Batch{}
	b.Queue(n.e.floorComplete, response.StatusCode, []byte(nil), response.Body, req.Scope, req.Key)
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return rollback(conn, err)
	}
	return nil
}

// rollback rolls back the transaction floorPipelined left open on conn,
// and returns err.
func rollback(conn *pgx.Conn, err error) error {
	_, _ = conn.Exec(context.Background(), "ROLLBACK")
	return err
}

// piped is n with its Do's transactions pipelined or not.
func (n *native) piped(on bool) *native {
	p := *n
	p.pipelined = on
	return &p
}

// fresh is a Do of a new key.
func (n *native) fresh(ctx context.Context) error { return n.do(ctx, n.e.Key(), false) }

// pipelinePair is two paths on pgx that run side by side: the pipelined
// one and the one it is compared with.
type pipelinePair struct {
	name, beside string
	path, other  func(n *native, w int) func(context.Context) error
}

// pipelinePairs are the pairs of TestPipelineGain: the floor by hand,
// pipelined and not (what #34 measured), Do in idempgx.RunTx's
// pipelined transaction and in pgx's own, and a replay from another
// instance pipelined beside a one-read transaction; all without HTTP.
var pipelinePairs = []pipelinePair{
	{"floor pipelined", "floor",
		func(n *native, _ int) func(context.Context) error { return n.floorPipelined },
		func(n *native, _ int) func(context.Context) error { return n.floor }},
	{"fresh pipelined", "fresh, pgx's own transaction",
		func(n *native, _ int) func(context.Context) error { return n.piped(true).fresh },
		func(n *native, _ int) func(context.Context) error { return n.piped(false).fresh }},
	{"cross pipelined", "read",
		func(n *native, w int) func(context.Context) error { return n.piped(true).crossReplayer(w, false) },
		func(n *native, w int) func(context.Context) error {
			return func(ctx context.Context) error { return n.read(ctx, replayKey(w)) }
		}},
}

// TestPipelineGain runs each pair of pipelinePairs as #34 measured the
// floor: both paths at once, conc workers each, in rounds; the ratio is
// the first's rate over the second's in the same round, median of the
// rounds. It runs briefly to check its shape; with IDEM_BENCH set, 7
// rounds (IDEM_BENCH_ROUNDS) of 3 s at 8 workers a path, the figures of
// docs/benchmarks.md. It checks no ratio: a measurement is no test.
func TestPipelineGain(t *testing.T) {
	rounds, conc, d := 2, 2, 100*time.Millisecond
	if os.Getenv("IDEM_BENCH") != "" {
		r, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS"))
		rounds, conc, d = cmp.Or(r, 7), 8, 3*time.Second
	}
	tg := targets[0] // pgx's database/sql driver: the Env's tables
	n := &native{e: seeded(t, tg.open(t), tg.dialect, conc), pool: nativePool(t)}
	ctx := context.Background()
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\tper s\tbeside\tper s\tratio\tratio range\t\n")
	for _, pair := range pipelinePairs {
		ps := []path{
			{name: pair.name, worker: func(_ *Env, w int) func(context.Context) error { return pair.path(n, w) }},
			{name: pair.beside, worker: func(_ *Env, w int) func(context.Context) error { return pair.other(n, w-conc) }},
		}
		var a, b, ratios []float64
		for range rounds {
			rates, err := measureTogether(ctx, n.e, ps, conc, d)
			if err != nil {
				t.Fatalf("%s beside %s: %v", pair.name, pair.beside, err)
			}
			a, b = append(a, rates[0]), append(b, rates[1])
			ratios = append(ratios, rates[0]/rates[1])
		}
		if len(ratios) != rounds || slices.Min(a) <= 0 || slices.Min(b) <= 0 {
			t.Errorf("%s beside %s: rates %v and %v: want one of each a round", pair.name, pair.beside, a, b)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.2f\t%.2f-%.2f\t\n", pair.name, median(a), pair.beside, median(b), median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("pgx, %d rounds of %v, %d workers a path:\n%s", rounds, d, conc, out.String())
}
