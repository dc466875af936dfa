// Package idemotel reports idem's outcomes to OpenTelemetry: an
// [idem.Observer] that counts them, times the calls, and adds an event to
// the caller's active span.
//
// It uses the OpenTelemetry API alone; the application brings the SDK and
// its exporters, and passes a MeterProvider with [WithMeterProvider] (or
// sets the global one). The root package idem does not import OpenTelemetry,
// so a program that does not use this package does not link it.
//
//	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp))
//	...
//	store, err := idem.New(idem.Postgres, idem.WithObserver(obs))
//
// # Instruments
//
//   - idem.outcomes, a counter ({outcome}): one per Event, by idem.outcome
//     ("executed", "replayed", "in_flight", "mismatch", "takeover",
//     "lease_lost", "failed", "purge_batch", "claimed", "released",
//     "invalid"), idemhttp's refusals included.
//   - idem.duration, a histogram (s) of the duration of each call (Do,
//     Begin, Complete, Release, a failed Extend) and purge batch, with the
//     bucket boundaries 1 ms to 10 s that the semantic conventions advise
//     for database operations.
//   - idem.purge.rows, a counter ({row}) of the records purge batches
//     deleted.
//
// Their attributes are idem.outcome, db.system.name ("postgresql", "mysql",
// "mariadb", "sqlite" or "other_sql"), db.collection.name (the Store's table) and, for a failed
// call or purge batch, error.type: a name for the kind of error, never its
// message. The request's Operation, Scope and Key are not metric
// attributes: the scope and key are unbounded, and the Operation is
// whatever the application makes it (idemhttp's default holds the URL
// path, with any identifiers in it).
//
// # Span events
//
// Each Event also becomes a span event, named "idem." plus the outcome
// (e.g. "idem.replayed"), on the span of the call's context, when that
// span is recording. It carries the metric attributes and idem.operation,
// idem.token (for a claim) and idem.purge.rows (for a purge batch);
// idem.scope and idem.key only with [WithScopeAndKey]. The [Observer] never
// sets the span's status or records an exception on it: the span is the
// caller's.
//
// Neither metrics nor span events ever carry the request's payload, its
// fingerprint or the stored response: an Event does not hold them.
package idemotel
