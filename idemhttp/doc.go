// Package idemhttp is net/http middleware that gives a handler the
// Idempotency-Key behaviour of draft-ietf-httpapi-idempotency-key-header,
// on top of [idem.Store].
//
// Every key belongs to a scope, the caller that owns it: [Config.Scope]
// is required, and returns the authenticated principal, tenant or API
// client, so that one caller's key never replays another's response. A
// service with a single caller says so with [SingleTenant].
//
// In [idemserve.ModeTransaction] (the default), for every request whose method it
// handles (POST and PATCH by default), the middleware reads the key and the
// body, opens a transaction with [idem.RunTx] and runs the handler inside
// [idem.Store.Do]. The handler writes its rows through [TxFrom]; its
// response is captured, stored with the key in the same transaction, and
// written to the client only after the commit succeeded. A retry with the
// same key gets the stored response back, marked Idempotent-Replayed: true,
// and the handler does not run. Duplicates that arrive at one process
// while a request with their key runs wait in memory, holding no database
// connection, then go to the database one at a time and replay its result
// (or run, if it ended without one); duplicates in other processes wait
// for its transaction on the database's row lock. With
// [idem.WithLockTimeout] on the Store both waits end at that bound with
// the same 409, so that a duplicate gets one answer whichever instance it
// reaches.
//
// A retryable database error (serialization failure, deadlock) in the
// middleware's own statements or the commit rolls back and runs the whole
// transaction again, handler included: a handler may therefore run more
// than once for one request, but only the rows of the attempt that commits
// remain. Side effects outside the transaction must be idempotent
// themselves. An error of the handler's own statements is the handler's to
// answer; a 5xx rolls back, and the client's retry runs it again.
//
// [idemserve.ModeClaim] is for handlers that call a slow external service, such as a
// payment provider, which must not run inside an open transaction. The
// middleware commits a claim on the key ([idem.Store.Begin]) and runs the
// handler with no transaction open; the handler passes
// ClaimFrom(ctx).RelayKey() to the provider as its idempotency key, then
// writes its rows through [TxFrom], whose first call begins the transaction
// in which the middleware completes the claim. Duplicates that arrive while
// it runs get a 409 with Retry-After.
//
// Work that started finishes: once a request holds its key, the handler
// runs on a context that the client's disconnect does not cancel (it keeps
// the request's values), bounded by [Config.Timeout]. Its response is
// stored even if the client has gone, and the client's retry replays it.
//
// What is stored and what is not, in both modes:
//   - 2xx, 3xx and 4xx answers are results: stored and replayed.
//   - 5xx answers are rolled back and not stored (a claim is released), so
//     the client's retry runs the handler again ([Config.StoreServerErrors]
//     changes this).
//   - A handler that panics is rolled back and nothing is stored; the panic
//     is passed on to net/http (or a recovering middleware around this one),
//     which drops the connection: nothing was written before the commit.
//   - A handler that calls Flush or Hijack is refused: see [ErrStreaming].
//
// A key is bound to the method, path, query and body, or to the members
// of a JSON body that [Config].FingerprintFields and FingerprintIgnore
// select (package jsonsel) and the header fields of FingerprintHeaders:
// a retry that repeats them replays, another request is a 422.
//
// Replays carry the stored status and body and, of the stored header
// fields, Content-Type, Location, ETag and those in [Config.ReplayHeaders];
// Set-Cookie is never stored or replayed. The middleware's own answers are
// application/problem+json (RFC 9457, see [Problem]): 400 for a malformed
// key, 413 for a body over [Config.MaxBody], 409 with Retry-After while
// another request holds the key, 422 for a key reused with another
// request, 410 for a key whose response is gone (a key memory:
// [Config.KeyMemory], else the Store's), with a Location header and a
// "reference" member naming what the first request created when its
// record kept it (its answer's Location, or [Config.ReferenceField]).
// docs/http.md describes them all and gives a client retry recipe.
//
// The middleware runs on database/sql ([Config].DB), or on any driver's
// pool through [Config].Runner: a pgx service sets it to
// idempgx.New(pool, opts), and its handlers take their pgx.Tx from
// idempgx.TxFrom. net/http's ServeMux
// and chi take [Middleware.Handler] as it is; gin and echo take it through
// the adapters of the modules github.com/idemkit/idem/contrib/idemgin and
// contrib/idemecho (docs/http.md, Routers).
package idemhttp
