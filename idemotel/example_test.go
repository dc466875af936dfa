package idemotel_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// The application's SDK providers feed the Observer; a retried request
// shows as an executed and a replayed outcome, and as span events on the
// request's span. A service would give the providers its exporters (OTLP,
// Prometheus) in place of the in-memory reader and recorder that make the
// output printable here.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.SQLite, idem.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}

	dir, err := os.MkdirTemp("", "idemotel-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	ctx, span := tp.Tracer("shop").Start(ctx, "POST /v1/charges")
	req := idem.Request{Scope: "tenant-1", Key: "order-42", Operation: "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte(`{"amount":100}`))}
	for range 2 { // the client retries after a lost answer
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := store.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201, Body: []byte(`{"id":"ch_1"}`)}, nil
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	span.End()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				outcome, _ := p.Attributes.Value(idemotel.OutcomeKey)
				system, _ := p.Attributes.Value(idemotel.DBSystemKey)
				fmt.Printf("%s{idem.outcome=%s, db.system.name=%s} %d\n", m.Name, outcome.String(), system.String(), p.Value)
			}
		}
	}
	for _, ev := range spans.Ended()[0].Events() {
		fmt.Println("span event", ev.Name)
	}
	// Unordered output:
	// idem.outcomes{idem.outcome=executed, db.system.name=sqlite} 1
	// idem.outcomes{idem.outcome=replayed, db.system.name=sqlite} 1
	// span event idem.executed
	// span event idem.replayed
}
