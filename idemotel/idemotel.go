package idemotel

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// ScopeName is the instrumentation scope of the Meter the [Observer]
// creates its instruments with.
const ScopeName = "github.com/idemkit/idem/idemotel"

// The names of the instruments an [Observer] records to.
const (
	// OutcomesMetric counts outcomes (unit {outcome}); each Event adds 1.
	OutcomesMetric = "idem.outcomes"
	// DurationMetric is the histogram of the calls' durations, in seconds
	// (unit s). Takeovers are counted but not timed: each is followed by
	// the outcome of the same call, which is.
	DurationMetric = "idem.duration"
	// PurgedMetric counts the records purge batches deleted (unit {row}).
	PurgedMetric = "idem.purge.rows"
	// CacheMetric counts the replay cache's hits, misses and evictions
	// (idem.WithReplayCache; unit {entry}), by [OutcomeKey]: "cache_hit",
	// "cache_miss", "cache_evicted" (which adds the entries evicted).
	// They are not outcomes: a hit is followed by its call's outcome,
	// which [OutcomesMetric] counts.
	CacheMetric = "idem.replay_cache"
)

// The attribute keys an [Observer] sets. db.system.name, db.collection.name
// and error.type are OpenTelemetry's semantic conventions; the others are
// idem's own.
const (
	// OutcomeKey is the Event's kind, idem.EventKind's String: "executed",
	// "replayed", "in_flight", "mismatch", "takeover", "lease_lost",
	// "failed", "purge_batch", "claimed", "released" or "invalid".
	OutcomeKey = attribute.Key("idem.outcome")
	// DBSystemKey is the database: "postgresql", "mysql" (idem.MySQL, on
	// MySQL or MariaDB: the dialect serves both and cannot tell them
	// apart), "mariadb" (idem.MariaDB), "sqlite", or "other_sql" for TiDB,
	// which the semantic conventions do not name, and for a dialect this
	// package does not know.
	DBSystemKey = attribute.Key("db.system.name")
	// DBCollectionKey is the Store's table, as given to idem.WithTable.
	DBCollectionKey = attribute.Key("db.collection.name")
	// ErrorTypeKey names the kind of error of a failed call or purge
	// batch, never its message (which may quote the key): see
	// [Observer.Observe].
	ErrorTypeKey = attribute.Key("error.type")
	// OperationKey is the request's Operation; on span events only.
	OperationKey = attribute.Key("idem.operation")
	// TokenKey is the claim's fencing token; on span events only.
	TokenKey = attribute.Key("idem.token")
	// PurgedRowsKey is the number of records a purge batch deleted; on
	// span events only (the metric is [PurgedMetric]).
	PurgedRowsKey = attribute.Key("idem.purge.rows")
	// ScopeKey is the request's Scope; on span events only, and only with
	// [WithScopeAndKey].
	ScopeKey = attribute.Key("idem.scope")
	// KeyKey is the request's Key; on span events only, and only with
	// [WithScopeAndKey].
	KeyKey = attribute.Key("idem.key")
)

// durationBuckets are the histogram's bucket boundaries in seconds: those
// OpenTelemetry's semantic conventions advise for database operations.
var durationBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}

// Observer is an [idem.Observer] that records every [idem.Event] as
// OpenTelemetry metrics, and as an event on the span active in the call's
// context. Create it with [NewObserver]; it is safe for concurrent use and
// may serve several Stores.
type Observer struct {
	outcomes     metric.Int64Counter
	duration     metric.Float64Histogram
	purged       metric.Int64Counter
	cache        metric.Int64Counter
	scopeAndKey  bool
	measurements sync.Map // setKey -> metric.MeasurementOption
}

// setKey identifies the attribute set of an Event that has no error.type.
// Its values are bounded by the kinds and by the Stores of a program.
type setKey struct {
	kind           idem.EventKind
	dialect, table string
}

var _ idem.Observer = (*Observer)(nil)

type config struct {
	mp          metric.MeterProvider
	scopeAndKey bool
}

// Option configures an [Observer].
type Option func(*config)

// WithMeterProvider sets the MeterProvider the [Observer] creates its
// instruments from. The default is the global one, otel.GetMeterProvider,
// as it is when [NewObserver] runs.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithScopeAndKey adds the request's Scope and Key to the span events, as
// idem.scope and idem.key. They are off by default: a scope or key may
// identify a user, and traces are often kept longer, and shown to more
// people, than the database. They are never metric attributes, whose
// cardinality they would make unbounded.
func WithScopeAndKey() Option {
	return func(c *config) { c.scopeAndKey = true }
}

// NewObserver returns an [Observer] that records to instruments of the
// MeterProvider [WithMeterProvider] sets, or of the global one. Span
// events need no provider: they go on the span of each call's context,
// which the application's tracer started. The error reports a nil
// MeterProvider or an instrument the provider refused.
func NewObserver(opts ...Option) (*Observer, error) {
	c := config{mp: otel.GetMeterProvider()}
	for _, opt := range opts {
		opt(&c)
	}
	if c.mp == nil {
		return nil, errors.New("idemotel: WithMeterProvider(nil); omit it for the global MeterProvider")
	}
	m := c.mp.Meter(ScopeName)
	o := &Observer{scopeAndKey: c.scopeAndKey}
	var err error
	if o.outcomes, err = m.Int64Counter(OutcomesMetric, metric.WithUnit("{outcome}"),
		metric.WithDescription("Outcomes of idem's calls and purge batches, by idem.outcome.")); err != nil {
		return nil, fmt.Errorf("idemotel: counter %s: %w", OutcomesMetric, err)
	}
	if o.duration, err = m.Float64Histogram(DurationMetric, metric.WithUnit("s"),
		metric.WithDescription("Duration of idem's calls (Do, Begin, Complete, Extend, Release) and purge batches."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, fmt.Errorf("idemotel: histogram %s: %w", DurationMetric, err)
	}
	if o.purged, err = m.Int64Counter(PurgedMetric, metric.WithUnit("{row}"),
		metric.WithDescription("Records deleted by idem's purge batches.")); err != nil {
		return nil, fmt.Errorf("idemotel: counter %s: %w", PurgedMetric, err)
	}
	if o.cache, err = m.Int64Counter(CacheMetric, metric.WithUnit("{entry}"),
		metric.WithDescription("The replay cache's hits, misses and evicted entries, by idem.outcome.")); err != nil {
		return nil, fmt.Errorf("idemotel: counter %s: %w", CacheMetric, err)
	}
	return o, nil
}

// Observe records ev: it adds 1 to [OutcomesMetric], records ev.Duration
// to [DurationMetric] (except for a takeover), adds a purge batch's rows
// to [PurgedMetric], and adds the event "idem." plus the outcome (e.g.
// "idem.executed") to the span of ctx when that span is recording. The
// replay cache's events (idem.EventCacheHit, EventCacheMiss,
// EventCacheEvicted) go to [CacheMetric] alone.
//
// The metric attributes are [OutcomeKey], [DBSystemKey], [DBCollectionKey]
// and, for a failed or invalid call and a failed purge batch,
// [ErrorTypeKey]. The span event
// has them too, and [OperationKey], [TokenKey] and [PurgedRowsKey] where
// they apply, and [ScopeKey] and [KeyKey] with [WithScopeAndKey].
//
// error.type is "panic" for a call that panicked, "idem.ErrInvalidKey" or
// "idem.ErrInvalidRequest" for a request refused as invalid,
// "idem.ErrUnsealable" for a stored response that cannot be opened (a
// record sealed with a key the process lacks), "context.Canceled",
// "context.DeadlineExceeded", "sql.ErrTxDone", "sql.ErrConnDone" or
// "driver.ErrBadConn" for those errors, otherwise the Go type of the
// innermost error in ev.Err's chain that is not a plain or wrapping error
// of the errors and fmt packages (e.g. "*pgconn.PgError"), and "_OTHER"
// when there is none. An error's message may quote the key, so it is never
// recorded, and Observe neither calls the span's RecordError nor sets its
// status: the span belongs to the caller, who knows whether the failure
// fails its operation.
func (o *Observer) Observe(ctx context.Context, ev idem.Event) {
	errType := ""
	if ev.Err != nil {
		errType = errorType(ev.Err)
	}
	m := o.measurement(ev, errType)
	switch ev.Kind {
	case idem.EventCacheHit, idem.EventCacheMiss:
		o.cache.Add(ctx, 1, m)
		return
	case idem.EventCacheEvicted:
		o.cache.Add(ctx, ev.Rows, m)
		return
	}
	o.outcomes.Add(ctx, 1, m)
	if ev.Kind != idem.EventTakeover {
		o.duration.Record(ctx, ev.Duration.Seconds(), m)
	}
	if ev.Kind == idem.EventPurgeBatch && ev.Rows > 0 {
		o.purged.Add(ctx, ev.Rows, m)
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = appendCommon(attrs, ev, errType)
	if ev.Operation != "" {
		attrs = append(attrs, OperationKey.String(ev.Operation))
	}
	if ev.Token != 0 {
		attrs = append(attrs, TokenKey.Int64(ev.Token))
	}
	if ev.Kind == idem.EventPurgeBatch {
		attrs = append(attrs, PurgedRowsKey.Int64(ev.Rows))
	}
	if o.scopeAndKey && ev.Kind != idem.EventPurgeBatch {
		attrs = append(attrs, ScopeKey.String(ev.Scope), KeyKey.String(ev.Key))
	}
	span.AddEvent("idem."+ev.Kind.String(), trace.WithAttributes(attrs...))
}

// measurement returns the metric attributes of ev: built once per kind,
// dialect and table, and for each failure (which also has error.type).
func (o *Observer) measurement(ev idem.Event, errType string) metric.MeasurementOption {
	if errType != "" {
		return metric.WithAttributeSet(attribute.NewSet(appendCommon(nil, ev, errType)...))
	}
	k := setKey{ev.Kind, ev.Dialect, ev.Table}
	if m, ok := o.measurements.Load(k); ok {
		return m.(metric.MeasurementOption)
	}
	m, _ := o.measurements.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(appendCommon(nil, ev, "")...)))
	return m.(metric.MeasurementOption)
}

// appendCommon appends the attributes metrics and span events share.
func appendCommon(attrs []attribute.KeyValue, ev idem.Event, errType string) []attribute.KeyValue {
	attrs = append(attrs, OutcomeKey.String(ev.Kind.String()), DBSystemKey.String(dbSystem(ev.Dialect)),
		DBCollectionKey.String(ev.Table))
	if errType != "" {
		attrs = append(attrs, ErrorTypeKey.String(errType))
	}
	return attrs
}

// dbSystem maps an idem dialect's name to the semantic conventions'
// db.system.name.
func dbSystem(dialect string) string {
	switch dialect {
	case "postgres":
		return "postgresql"
	case "mysql", "mariadb", "sqlite":
		return dialect
	}
	return "other_sql"
}

// knownErrors are the errors whose name error.type gives in place of
// their type's, which says little.
var knownErrors = []struct {
	err  error
	name string
}{
	{idem.ErrInvalidKey, "idem.ErrInvalidKey"},
	{idem.ErrInvalidRequest, "idem.ErrInvalidRequest"},
	{idem.ErrUnsealable, "idem.ErrUnsealable"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
	{sql.ErrTxDone, "sql.ErrTxDone"},
	{sql.ErrConnDone, "sql.ErrConnDone"},
	{driver.ErrBadConn, "driver.ErrBadConn"},
}

// plainTypes are the error types that say nothing of the error: errors.New,
// fmt.Errorf and errors.Join.
var plainTypes = map[string]bool{
	"*errors.errorString": true,
	"*fmt.wrapError":      true,
	"*fmt.wrapErrors":     true,
	"*errors.joinError":   true,
}

// errorType is the error.type of err, described at Observer.Observe.
func errorType(err error) string {
	if errors.Is(err, idem.ErrPanicked) {
		return "panic"
	}
	for _, k := range knownErrors {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	name := "_OTHER"
	for err != nil {
		if t := reflect.TypeOf(err).String(); !plainTypes[t] {
			name = t
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			err = nil
			if errs := u.Unwrap(); len(errs) > 0 {
				err = errs[0]
			}
		default:
			err = nil
		}
	}
	return name
}
