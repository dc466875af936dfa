package bench

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
)

// native runs the paths of an Env through pgx without database/sql, on the
// Env's own tables and statements: its idem table through idempgx's
// adapter of pgx.Tx, the floor's and the order table through pgx.Tx.
// With pipelined, Do's transactions are idempgx.RunTx's, which send BEGIN
// with the claim and COMMIT with the completion; without it, pgx's own
// (pgx.BeginFunc), as the hand-written floor's always are.
type native struct {
	e         *Env
	pool      *pgxpool.Pool
	pipelined bool
}

func (n *native) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, n.pool, fn)
}

// doTx runs fn in the transaction of a Do: RunTx's when n is pipelined.
func (n *native) doTx(ctx context.Context, fn func(pgx.Tx) error) error {
	if n.pipelined {
		return idempgx.RunTx(ctx, n.pool, pgx.TxOptions{}, fn)
	}
	return n.tx(ctx, fn)
}

func (n *native) order(ctx context.Context, tx pgx.Tx, key string) error {
	_, err := tx.Exec(ctx, n.e.insert, key, 100)
	return err
}

func (n *native) bare(ctx context.Context) error {
	return n.tx(ctx, func(tx pgx.Tx) error { return n.order(ctx, tx, "bare") })
}

func (n *native) do(ctx context.Context, key string, replay bool) error {
	return n.doOn(ctx, n.e.store, key, replay)
}

// doOn is do through the Store s.
func (n *native) doOn(ctx context.Context, s *idem.Store, key string, replay bool) error {
	return n.doTx(ctx, func(tx pgx.Tx) error {
		res, err := s.DoOn(ctx, idempgx.Tx(tx), Request(key), func(ctx context.Context) (idem.Response, error) {
			return response, n.order(ctx, tx, key)
		})
		if err == nil && res.Replayed != replay {
			err = fmt.Errorf("bench: key %q: replayed=%v, want %v", key, res.Replayed, replay)
		}
		return err
	})
}

// crossReplayer is Env.crossReplayer through pgx.
func (n *native) crossReplayer(w int, hinted bool) func(context.Context) error {
	return replayCross(n.e.crossKeys(w), hinted, n.doOn)
}

func (n *native) floor(ctx context.Context) error {
	return n.tx(ctx, func(tx pgx.Tx) error {
		req := Request(n.e.Key())
		if _, err := tx.Exec(ctx, n.e.floorClaim, req.Scope, req.Key, req.Operation, req.Fingerprint); err != nil {
			return err
		}
		if err := n.order(ctx, tx, req.Key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, n.e.floorComplete, response.StatusCode, []byte(nil), response.Body, req.Scope, req.Key)
		return err
	})
}

func (n *native) read(ctx context.Context, key string) error {
	return n.tx(ctx, func(tx pgx.Tx) error {
		var (
			op, fp, status string
			code           sql.NullInt64
			header, body   []byte
		)
		return tx.QueryRow(ctx, n.e.floorRead, "bench", key).Scan(&op, &fp, &status, &code, &header, &body)
	})
}

// nativePaths are the paths of BenchmarkNativePgx, each through
// database/sql over pgx (the Env) and through pgx alone.
var nativePaths = []struct {
	name   string
	sql    func(e *Env, w int) func(context.Context) error
	native func(n *native, w int) func(context.Context) error
}{
	{"bare", func(e *Env, _ int) func(context.Context) error { return e.Bare },
		func(n *native, _ int) func(context.Context) error { return n.bare }},
	{"floor", func(e *Env, _ int) func(context.Context) error { return e.Floor },
		func(n *native, _ int) func(context.Context) error { return n.floor }},
	{"fresh", func(e *Env, _ int) func(context.Context) error { return e.Fresh },
		func(n *native, _ int) func(context.Context) error {
			return func(ctx context.Context) error { return n.do(ctx, n.e.Key(), false) }
		}},
	{"read", func(e *Env, w int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Read(ctx, replayKey(w)) }
	}, func(n *native, w int) func(context.Context) error {
		return func(ctx context.Context) error { return n.read(ctx, replayKey(w)) }
	}},
	{"replay", func(e *Env, w int) func(context.Context) error {
		return func(ctx context.Context) error { return e.Do(ctx, replayKey(w), true) }
	}, func(n *native, w int) func(context.Context) error {
		return func(ctx context.Context) error { return n.do(ctx, replayKey(w), true) }
	}},
}

// BenchmarkNativePgx runs each path at concurrency 16 through database/sql
// over pgx (stdlib) and through pgx alone (idempgx, pgxpool), one beside
// the other, on the same tables, with pools of the same size. Divide a
// path's ns/op by its floor's (fresh by floor, replay by read) of the same
// driver for the ratios in docs/benchmarks.md.
//
//	go test -run '^$' -bench NativePgx -benchtime 3s ./internal/bench
func BenchmarkNativePgx(b *testing.B) {
	tg := targets[0] // pgx's database/sql driver
	n := &native{e: seeded(b, tg.open(b), tg.dialect, 16), pool: nativePool(b)}
	for _, p := range nativePaths {
		for _, via := range []string{"stdlib", "native"} {
			b.Run(p.name+"/"+via, func(b *testing.B) {
				b.ReportAllocs()
				parallel(b, 16, func(w int) func(context.Context) error {
					if via == "native" {
						return p.native(n, w)
					}
					return p.sql(n.e, w)
				})
			})
		}
	}
}
