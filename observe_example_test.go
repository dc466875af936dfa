package idem_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/idemkit/idem"
)

// SlogObserver logs one line per outcome. Pass it to New with WithObserver;
// here it is called directly with the events a takeover and a purge batch
// would produce.
func ExampleSlogObserver() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	}))
	obs := idem.SlogObserver(logger)
	if _, err := idem.New(idem.Postgres, idem.WithObserver(obs)); err != nil {
		panic(err)
	}

	ctx := context.Background()
	obs.Observe(ctx, idem.Event{Kind: idem.EventTakeover, Table: "idempotency_keys", Scope: "tenant-1",
		Key: "order-42", Operation: "POST /v1/charges", Duration: 3 * time.Millisecond, Token: 1764495000000000})
	obs.Observe(ctx, idem.Event{Kind: idem.EventPurgeBatch, Table: "idempotency_keys",
		Duration: 40 * time.Millisecond, Rows: 1000})
	// Output:
	// level=WARN msg="idem takeover" table=idempotency_keys scope=tenant-1 key=order-42 operation="POST /v1/charges" duration=3ms token=1764495000000000
	// level=DEBUG msg="idem purge_batch" table=idempotency_keys duration=40ms rows=1000
}
