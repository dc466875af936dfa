package httpdriver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

type fakeTx struct{ rolledBack atomic.Int64 }

func (*fakeTx) Commit(context.Context) error { return nil }
func (t *fakeTx) Rollback(context.Context) error {
	t.rolledBack.Add(1)
	return nil
}

// A Lazy Holder begins its transaction once, on the first Tx, however many
// goroutines ask; a failed begin is reported to every caller; Rollback
// rolls back what began and keeps what did not from beginning.
func TestHolder(t *testing.T) {
	var begins atomic.Int64
	tx := &fakeTx{}
	h := Lazy(nil, func() (Tx, error) {
		begins.Add(1)
		return tx, nil
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if got, err := h.Tx(); got != tx || err != nil {
				t.Errorf("Tx: %v, %v", got, err)
			}
		})
	}
	wg.Wait()
	if n := begins.Load(); n != 1 {
		t.Fatalf("began %d times, want once", n)
	}
	h.Rollback(context.Background())
	if n := tx.rolledBack.Load(); n != 1 {
		t.Fatalf("rolled back %d times, want once", n)
	}

	failed := errors.New("no connection")
	h = Lazy(nil, func() (Tx, error) { return nil, failed })
	for range 2 {
		if got, err := h.Tx(); got != nil || !errors.Is(err, failed) {
			t.Fatalf("Tx after a failed begin: %v, %v", got, err)
		}
	}

	h = Lazy(nil, func() (Tx, error) {
		t.Error("began after Rollback")
		return nil, nil
	})
	h.Rollback(context.Background())
	if got, err := h.Tx(); got != nil || err != nil {
		t.Fatalf("Tx after Rollback: %v, %v; want nothing", got, err)
	}

	if got, err := Open(nil, tx).Tx(); got != tx || err != nil {
		t.Fatalf("Open's Tx: %v, %v", got, err)
	}
}

// The context carries a Holder and a Claim, and nothing else answers for
// them.
func TestContext(t *testing.T) {
	ctx := context.Background()
	if HolderFrom(ctx) != nil || ClaimFrom(ctx) != nil {
		t.Fatal("an empty context carries a Holder or a Claim")
	}
	h := Open(nil, &fakeTx{})
	if got := HolderFrom(WithHolder(ctx, h)); got != h {
		t.Fatalf("HolderFrom: %v, want %v", got, h)
	}
	c := &fakeClaim{}
	if got := ClaimFrom(WithClaim(ctx, c)); got != c {
		t.Fatalf("ClaimFrom: %v, want %v", got, c)
	}
}

type fakeClaim struct{}

func (*fakeClaim) Complete(context.Context, Tx, idem.Response) error { return nil }
func (*fakeClaim) Release(context.Context) error                     { return nil }
