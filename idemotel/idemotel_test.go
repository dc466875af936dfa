package idemotel_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// rig is an Observer recording to an in-memory reader, and a tracer whose
// ended spans a recorder keeps.
type rig struct {
	obs    *idemotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newRig(t *testing.T, opts ...idemotel.Option) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	obs, err := idemotel.NewObserver(append([]idemotel.Option{
		idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.obs = obs
	return r
}

// collect returns the data of the instruments, by name.
func (r *rig) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			t.Errorf("instrumentation scope %q, want %q", sm.Scope.Name, idemotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// label names a data point by its outcome and error.type, the attributes
// that vary in a test.
func label(set attribute.Set) string {
	outcome, _ := set.Value(idemotel.OutcomeKey)
	if et, ok := set.Value(idemotel.ErrorTypeKey); ok {
		return outcome.AsString() + "/" + et.AsString()
	}
	return outcome.AsString()
}

// sums returns the points of an int64 counter by label, and fails the test
// unless it is a monotonic cumulative sum.
func sums(t *testing.T, data metricdata.Aggregation) map[string]int64 {
	t.Helper()
	sum, ok := data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality {
		t.Fatalf("data %#v, want a monotonic cumulative Sum[int64]", data)
	}
	out := map[string]int64{}
	for _, p := range sum.DataPoints {
		out[label(p.Attributes)] += p.Value
	}
	return out
}

// counts returns the number of values recorded in a float64 histogram,
// by label.
func counts(t *testing.T, data metricdata.Aggregation) map[string]int64 {
	t.Helper()
	h, ok := data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("data %#v, want a Histogram[float64]", data)
	}
	out := map[string]int64{}
	for _, p := range h.DataPoints {
		out[label(p.Attributes)] += int64(p.Count)
	}
	return out
}

// points returns the attribute sets of every point of every instrument.
func points(data map[string]metricdata.Aggregation) []attribute.Set {
	var out []attribute.Set
	for _, d := range data {
		switch d := d.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				out = append(out, p.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				out = append(out, p.Attributes)
			}
		}
	}
	return out
}

func sameCounts(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// openDB opens a SQLite database with idem's table in a temporary
// directory.
func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "idem.db")+
		"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := idem.New(idem.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// declinedError is an error type of the application's own, which
// error.type names.
type declinedError struct{ card string }

func (e *declinedError) Error() string { return "card " + e.card + " declined" }

// The secrets a test request carries, which must reach no attribute.
const (
	secretScope = "tenant-secret-scope"
	secretKey   = "order-secret-key"
	secretBody  = `{"card":"4242-secret-body"}`
)

var secretPrint = idem.Fingerprint([]byte(secretBody))

// doTx runs s.Do for req in a transaction of its own, committed when Do
// succeeds, and recovers a panic of fn.
func doTx(ctx context.Context, t *testing.T, db *sql.DB, s *idem.Store, req idem.Request, fn func() (idem.Response, error)) (res idem.Result, err error) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	must(t, err)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
		if err != nil {
			must(t, tx.Rollback())
			return
		}
		must(t, tx.Commit())
	}()
	return s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) { return fn() })
}

// A Store on SQLite goes through every outcome; the counter, the histogram
// and the span events of the caller's span record each one, with the
// database and table, and none carries the scope, key, payload,
// fingerprint or response.
func TestOutcomesOnSQLite(t *testing.T) {
	r := newRig(t)
	db := openDB(t)
	// A claim's record expires its retention after its lease's end, or
	// after its completion when that is later: the purge at the end finds
	// the completed ones past both.
	const lease, retention = time.Second, 500 * time.Millisecond
	s, err := idem.New(idem.SQLite, idem.WithObserver(r.obs), idem.WithLease(lease))
	must(t, err)
	ctx, span := r.tp.Tracer("test").Start(context.Background(), "request")

	req := func(key string) idem.Request {
		return idem.Request{Scope: secretScope, Key: secretKey + "-" + key, Operation: "POST /v1/charges", Fingerprint: secretPrint, Retention: retention}
	}
	ok := func() (idem.Response, error) { return idem.Response{StatusCode: 201, Body: []byte(secretBody)}, nil }

	_, err = doTx(ctx, t, db, s, req("a"), ok)
	must(t, err)
	res, err := doTx(ctx, t, db, s, req("a"), ok)
	must(t, err)
	if !res.Replayed {
		t.Fatal("the second Do did not replay")
	}
	other := req("a")
	other.Fingerprint = idem.Fingerprint([]byte("another payload"))
	if _, err := doTx(ctx, t, db, s, other, ok); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Do with another payload: %v, want ErrMismatch", err)
	}

	first, _, err := s.Begin(ctx, db, req("b"))
	must(t, err)
	if _, err := doTx(ctx, t, db, s, req("b"), ok); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("Do beside a live claim: %v, want ErrInFlight", err)
	}
	must(t, first.Release(ctx, db))
	err = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error { return first.Complete(ctx, tx, idem.Response{StatusCode: 201}) })
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete after Release: %v, want ErrLeaseLost", err)
	}
	second, _, err := s.Begin(ctx, db, req("b"))
	must(t, err)
	must(t, idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		return second.Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte(secretBody)})
	}))

	if _, err := doTx(ctx, t, db, s, req("c"), func() (idem.Response, error) {
		return idem.Response{}, fmt.Errorf("charge %s: %w", secretKey, &declinedError{card: secretBody})
	}); err == nil {
		t.Fatal("Do whose fn failed returned no error")
	}
	if _, err := doTx(ctx, t, db, s, req("d"), func() (idem.Response, error) { panic(secretBody) }); err == nil {
		t.Fatal("Do whose fn panicked returned no error")
	}
	invalid := req("e")
	invalid.Key += " with a space"
	if _, err := doTx(ctx, t, db, s, invalid, ok); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("Do with an invalid key: %v, want ErrInvalidKey", err)
	}

	time.Sleep(lease + retention + 100*time.Millisecond)
	n, err := s.Purge(ctx, db, 100)
	must(t, err)
	if n != 2 {
		t.Fatalf("Purge deleted %d records, want the 2 completed ones", n)
	}
	span.End()

	data := r.collect(t)
	sameCounts(t, idemotel.OutcomesMetric, sums(t, data[idemotel.OutcomesMetric]), map[string]int64{
		"executed": 2, "replayed": 1, "mismatch": 1, "claimed": 2, "in_flight": 1, "released": 1, "lease_lost": 1,
		"takeover": 1, "failed/*idemotel_test.declinedError": 1, "failed/panic": 1, "invalid/idem.ErrInvalidKey": 1,
		"purge_batch": 1,
	})
	sameCounts(t, idemotel.DurationMetric, counts(t, data[idemotel.DurationMetric]), map[string]int64{
		"executed": 2, "replayed": 1, "mismatch": 1, "claimed": 2, "in_flight": 1, "released": 1, "lease_lost": 1,
		"failed/*idemotel_test.declinedError": 1, "failed/panic": 1, "invalid/idem.ErrInvalidKey": 1,
		"purge_batch": 1,
	})
	sameCounts(t, idemotel.PurgedMetric, sums(t, data[idemotel.PurgedMetric]), map[string]int64{"purge_batch": 2})
	for _, set := range points(data) {
		sys, _ := set.Value(idemotel.DBSystemKey)
		table, _ := set.Value(idemotel.DBCollectionKey)
		if sys.AsString() != "sqlite" || table.AsString() != idem.DefaultTable {
			t.Errorf("point %s: want db.system.name sqlite and db.collection.name %s", set.Encoded(attribute.DefaultEncoder()), idem.DefaultTable)
		}
		for _, k := range []attribute.Key{idemotel.OperationKey, idemotel.ScopeKey, idemotel.KeyKey, idemotel.TokenKey} {
			if set.HasValue(k) {
				t.Errorf("point %s has %s, which only span events carry", set.Encoded(attribute.DefaultEncoder()), k)
			}
		}
		noSecret(t, "metric point", set.ToSlice())
	}

	ended := r.spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want the caller's span only", len(ended))
	}
	var names []string
	tokens := map[string][]int64{}
	for _, ev := range ended[0].Events() {
		names = append(names, ev.Name)
		noSecret(t, ev.Name, ev.Attributes)
		set := attribute.NewSet(ev.Attributes...)
		if outcome, _ := set.Value(idemotel.OutcomeKey); "idem."+outcome.AsString() != ev.Name {
			t.Errorf("event %s has idem.outcome %q", ev.Name, outcome.AsString())
		}
		if sys, _ := set.Value(idemotel.DBSystemKey); sys.AsString() != "sqlite" {
			t.Errorf("event %s has db.system.name %q, want sqlite", ev.Name, sys.AsString())
		}
		op, hasOp := set.Value(idemotel.OperationKey)
		if ev.Name != "idem.purge_batch" && op.AsString() != "POST /v1/charges" || ev.Name == "idem.purge_batch" && hasOp {
			t.Errorf("event %s has idem.operation %q", ev.Name, op.AsString())
		}
		if rows, _ := set.Value(idemotel.PurgedRowsKey); ev.Name == "idem.purge_batch" && rows.AsInt64() != 2 {
			t.Errorf("event %s has idem.purge.rows %d, want 2", ev.Name, rows.AsInt64())
		}
		if token, ok := set.Value(idemotel.TokenKey); ok {
			tokens[ev.Name] = append(tokens[ev.Name], token.AsInt64())
		}
	}
	want := []string{"idem.executed", "idem.replayed", "idem.mismatch", "idem.claimed", "idem.in_flight",
		"idem.released", "idem.lease_lost", "idem.takeover", "idem.claimed", "idem.executed",
		"idem.failed", "idem.failed", "idem.invalid", "idem.purge_batch"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("span events:\n got %v\nwant %v", names, want)
	}
	t1, t2 := first.Token(), second.Token()
	sameCounts(t, "tokens", map[string]int64{"claimed": int64(len(tokens["idem.claimed"]))}, map[string]int64{"claimed": 2})
	if fmt.Sprint(tokens) != fmt.Sprint(map[string][]int64{"idem.claimed": {t1, t2}, "idem.released": {t1},
		"idem.lease_lost": {t1}, "idem.takeover": {t1}, "idem.executed": {t2}}) {
		t.Errorf("tokens of the span events %v; the claims' %d and %d", tokens, t1, t2)
	}
}

// noSecret fails the test when an attribute value holds the scope, key,
// payload or fingerprint of a request.
func noSecret(t *testing.T, where string, attrs []attribute.KeyValue) {
	t.Helper()
	for _, kv := range attrs {
		v := kv.Value.String()
		for _, secret := range []string{secretScope, secretKey, secretBody, "4242", secretPrint} {
			if strings.Contains(v, secret) {
				t.Errorf("%s: attribute %s=%q holds %q", where, kv.Key, v, secret)
			}
		}
	}
}

// spanEvents calls Observe for each event inside a span of its own, and
// returns the attributes of the span events, one set per event.
func (r *rig) spanEvents(t *testing.T, evs ...idem.Event) []attribute.Set {
	t.Helper()
	var out []attribute.Set
	for _, ev := range evs {
		ctx, span := r.tp.Tracer("test").Start(context.Background(), "request")
		r.obs.Observe(ctx, ev)
		span.End()
		got := r.spans.Ended()
		events := got[len(got)-1].Events()
		if len(events) != 1 {
			t.Fatalf("%d span events for one Event, want 1", len(events))
		}
		out = append(out, attribute.NewSet(events[0].Attributes...))
	}
	return out
}

// WithScopeAndKey puts the scope and key on span events, and never on the
// metrics.
func TestWithScopeAndKey(t *testing.T) {
	r := newRig(t, idemotel.WithScopeAndKey())
	set := r.spanEvents(t, idem.Event{Kind: idem.EventReplayed, Table: "keys", Dialect: "postgres",
		Scope: secretScope, Key: secretKey, Operation: "POST /v1/charges", Duration: time.Millisecond})[0]
	scope, _ := set.Value(idemotel.ScopeKey)
	key, _ := set.Value(idemotel.KeyKey)
	if scope.AsString() != secretScope || key.AsString() != secretKey {
		t.Errorf("span event %s: want idem.scope %q and idem.key %q", set.Encoded(attribute.DefaultEncoder()), secretScope, secretKey)
	}
	for _, p := range points(r.collect(t)) {
		noSecret(t, "metric point", p.ToSlice())
	}
}

// db.system.name follows the semantic conventions' names of the
// databases.
func TestDBSystem(t *testing.T) {
	r := newRig(t)
	for dialect, want := range map[string]string{"postgres": "postgresql", "mysql": "mysql", "mariadb": "mariadb", "tidb": "other_sql", "sqlite": "sqlite", "": "other_sql"} {
		set := r.spanEvents(t, idem.Event{Kind: idem.EventExecuted, Table: "keys", Dialect: dialect})[0]
		if got, _ := set.Value(idemotel.DBSystemKey); got.AsString() != want {
			t.Errorf("dialect %q: db.system.name %q, want %q", dialect, got.AsString(), want)
		}
	}
}

// pgError stands for a driver's error type.
type pgError struct{ code string }

func (e *pgError) Error() string { return "ERROR: " + e.code }

// error.type names the kind of error, found through wrapping, never its
// message.
func TestErrorType(t *testing.T) {
	r := newRig(t)
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("idem: complete key %q: %w", secretKey, &pgError{"40001"}), "*idemotel_test.pgError"},
		{fmt.Errorf("a %w wrapping %w", &pgError{"40001"}, errors.New(secretKey)), "*idemotel_test.pgError"},
		{errors.Join(&pgError{"23505"}, errors.New(secretKey)), "*idemotel_test.pgError"},
		{fmt.Errorf("outer: %w", &declinedError{card: secretBody}), "*idemotel_test.declinedError"},
		{fmt.Errorf("key %s: %w", secretKey, context.Canceled), "context.Canceled"},
		{fmt.Errorf("key %s: %w", secretKey, context.DeadlineExceeded), "context.DeadlineExceeded"},
		{fmt.Errorf("key %s: %w", secretKey, sql.ErrTxDone), "sql.ErrTxDone"},
		{&idem.Error{Op: "open the stored response", Key: secretKey, Err: &idem.UnsealableError{KeyID: "k1", Err: errors.New(secretKey)}}, "idem.ErrUnsealable"},
		{errors.New(secretKey), "_OTHER"},
		{fmt.Errorf("charge: %w", errors.New(secretKey)), "_OTHER"},
	}
	for _, c := range cases {
		set := r.spanEvents(t, idem.Event{Kind: idem.EventFailed, Table: "keys", Dialect: "postgres", Err: c.err})[0]
		if got, _ := set.Value(idemotel.ErrorTypeKey); got.AsString() != c.want {
			t.Errorf("error %q: error.type %q, want %q", c.err, got.AsString(), c.want)
		}
		noSecret(t, "span event", set.ToSlice())
	}
	set := r.spanEvents(t, idem.Event{Kind: idem.EventPurgeBatch, Table: "keys", Dialect: "mysql", Err: &pgError{"1205"}})[0]
	if got, _ := set.Value(idemotel.ErrorTypeKey); got.AsString() != "*idemotel_test.pgError" {
		t.Errorf("failed purge batch: error.type %q", got.AsString())
	}
	got := sums(t, r.collect(t)[idemotel.OutcomesMetric])
	if got["failed/*idemotel_test.pgError"] != 3 || got["purge_batch/*idemotel_test.pgError"] != 1 {
		t.Errorf("outcomes %v: want 3 failed and 1 purge_batch with error.type *idemotel_test.pgError", got)
	}
}

// Without WithMeterProvider the Observer records to the global
// MeterProvider; a nil one is refused.
func TestMeterProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer otel.SetMeterProvider(noop.NewMeterProvider())
	obs, err := idemotel.NewObserver()
	must(t, err)
	obs.Observe(context.Background(), idem.Event{Kind: idem.EventExecuted, Table: "keys", Dialect: "sqlite"})
	r := &rig{reader: reader}
	sameCounts(t, idemotel.OutcomesMetric, sums(t, r.collect(t)[idemotel.OutcomesMetric]), map[string]int64{"executed": 1})

	if _, err := idemotel.NewObserver(idemotel.WithMeterProvider(nil)); err == nil {
		t.Error("NewObserver with a nil MeterProvider returned no error")
	}
}

// Goroutines may share an Observer, and Stores on several tables too: no
// count is lost, and each table has its points.
func TestConcurrent(t *testing.T) {
	r := newRig(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 100 {
				r.obs.Observe(context.Background(), idem.Event{Kind: idem.EventReplayed, Table: fmt.Sprint("t", g%2), Dialect: "postgres"})
			}
		})
	}
	wg.Wait()
	per := map[string]int64{}
	sum := r.collect(t)[idemotel.OutcomesMetric].(metricdata.Sum[int64])
	for _, p := range sum.DataPoints {
		table, _ := p.Attributes.Value(idemotel.DBCollectionKey)
		per[table.AsString()] += p.Value
	}
	sameCounts(t, "replays per table", per, map[string]int64{"t0": 400, "t1": 400})
}

// The replay cache's hits, misses and evictions are counted in
// CacheMetric, and not as outcomes: a hit's outcome (replayed) is.
func TestReplayCacheCounts(t *testing.T) {
	r := newRig(t)
	db := openDB(t)
	s, err := idem.New(idem.SQLite, idem.WithObserver(r.obs), idem.WithReplayCache(idem.ReplayCache{MaxEntries: 1}))
	must(t, err)
	ctx := context.Background()
	req := func(key string) idem.Request {
		return idem.Request{Scope: secretScope, Key: secretKey + "-" + key, Operation: "POST /v1/charges", Fingerprint: secretPrint}
	}
	ok := func() (idem.Response, error) { return idem.Response{StatusCode: 201, Body: []byte(secretBody)}, nil }
	for _, key := range []string{"a", "a", "a", "b"} { // miss (executed), hit, hit, miss (executed) evicting a
		must(t, idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := s.Do(ctx, tx, req(key), func(context.Context) (idem.Response, error) { return ok() })
			return err
		}))
	}
	data := r.collect(t)
	sameCounts(t, idemotel.CacheMetric, sums(t, data[idemotel.CacheMetric]), map[string]int64{"cache_hit": 2, "cache_miss": 2, "cache_evicted": 1})
	sameCounts(t, idemotel.OutcomesMetric, sums(t, data[idemotel.OutcomesMetric]), map[string]int64{"executed": 2, "replayed": 2})
}
