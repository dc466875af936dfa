// Package idemgrpc gives a gRPC service the guarantees of idemhttp: a
// unary server interceptor that runs each call with an idempotency key at
// most once and replays its answer to every retry, on top of
// [idem.Store], and a client interceptor that sends every call with a
// key and keeps it across retries.
//
// The key comes from the [MetadataKey] metadata ("idempotency-key"), or,
// for an API that follows AIP-155, from a string field of the request
// that [Config.KeyField] names ("request_id"). Every key belongs to a
// scope, the caller that owns it: [Config.Scope] is required, and returns
// the authenticated principal, tenant or API client, so that one caller's
// key never replays another's answer. A service with a single caller says
// so with [SingleTenant]. The key is bound to the full method name and to
// the request message, fingerprinted in a canonical form of its fields
// that does not depend on the protobuf release, or to the fields
// [Config].FingerprintFields and FingerprintIgnore select of it; the same
// key with another method or message is FAILED_PRECONDITION.
//
// In [idemserve.ModeTransaction] (the default) the interceptor opens a transaction
// with [idem.RunTx] and runs the handler inside [idem.Store.Do]. The
// handler writes its rows through [TxFrom]; its answer (the reply message,
// or its status: code, message and details) is stored with the key in the
// same transaction, and sent only after the commit. A retry with the same
// key gets the stored answer back, its trailer marked
// idempotent-replayed: true, and the handler does not run. Duplicates
// that arrive at one process while a call with their key runs wait in
// memory, holding no database connection, bounded as a duplicate in
// another process is bounded on the row lock (the Store's
// [idem.WithLockTimeout], else [Config.Timeout]); then they replay its
// result, or get UNAVAILABLE with a RetryInfo.
//
// [idemserve.ModeClaim] is for handlers that call a slow external service, such as
// a payment provider, which must not run inside an open transaction. The
// interceptor commits a claim on the key ([idem.Store.Begin]) and runs the
// handler with no transaction open; the handler passes
// ClaimFrom(ctx).RelayKey() to the provider as its idempotency key, then
// writes its rows through [TxFrom], whose first call begins the
// transaction in which the interceptor completes the claim. Duplicates
// that arrive while it runs get UNAVAILABLE with a RetryInfo and a
// grpc-retry-pushback-ms trailer, which gRPC's own retry policy obeys.
//
// Work that started finishes: once a call holds its key, the handler runs
// on a context that the client's cancellation and deadline do not end (it
// keeps the call's values), bounded by [Config.Timeout]. Its answer is
// stored even if the client has gone, and the client's retry replays it.
//
// What is stored: OK and the codes that describe the request
// (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE) are results, stored
// and replayed with the handler's rows committed. The codes that ask for a
// retry (UNAVAILABLE, ABORTED, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
// CANCELLED) and the server errors (UNKNOWN, INTERNAL, DATA_LOSS,
// UNIMPLEMENTED; unless [Config.StoreServerErrors]) roll back and release
// the claim, so the retry runs again. A handler that panics rolls back
// and the panic goes on. Replays carry the header and trailer metadata
// that [Config.ReplayMetadata] lists.
//
// Methods without side effects pass through untouched: those whose
// descriptor declares option idempotency_level = NO_SIDE_EFFECTS, and
// those [Config.NoSideEffects] lists. Requests and replies must be
// protocol buffer messages; a stored reply is decoded into a message of
// its type found in protoregistry.GlobalTypes, where generated code
// registers it. A handler behind the interceptor sees a stream of the
// interceptor's (grpc.SetHeader, grpc.SendHeader and grpc.SetTrailer are
// kept until the commit); grpc.SetSendCompressor is not available to it.
//
// docs/grpc.md has the status table, the AIP-155 mapping and a retry
// policy for clients.
package idemgrpc
