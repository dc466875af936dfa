// Package idemwatermill makes a watermill consumer apply each message
// exactly once: a router middleware, on top of [idem.Store] and package
// idemserve, that runs the handler of each message under an idempotency
// key and records the key, with a fingerprint of the message and what
// it published, in the handler's own database transaction, beside its
// rows. Brokers deliver at least once (a message is redelivered after a
// crash between the commit and the ack, a lost ack, an expired ack
// deadline, a producer's retry); with the middleware, a redelivery of a
// message whose effects committed is acked without running the
// handler, and publishes nothing again.
//
//	consume, err := idemwatermill.Middleware(idemwatermill.Config{Store: store, DB: db})
//	router.AddMiddleware(poisonQueue, retry.Middleware, consume)
//	router.AddConsumerHandler("record-order", "orders", subscriber, func(msg *message.Message) error {
//		tx := idemwatermill.TxFrom(msg.Context()) // write your rows here; never Commit or Rollback it
//		_, err := tx.ExecContext(msg.Context(), "INSERT INTO orders (id, item) VALUES ($1, $2)", msg.UUID, msg.Payload)
//		return err
//	})
//
// The key is the message's UUID, or what [Config.Key] returns
// ([MetadataKey]: a producer's idempotency key, in a metadata field); a
// message without a valid key is an error, never processed unguarded.
// The scope is the router's handler name, so that two handlers (two
// consumers of one message) each apply it once, or [Config.Scope]. The
// key is bound to the topic and to a fingerprint of the payload and of
// the metadata fields [Config.Fingerprint] names, or of what
// [Config].PayloadFields and PayloadIgnore select of a JSON payload
// ([FingerprintOf] computes it): the same key with another payload is
// [idem.ErrMismatch], never applied, and returned so that watermill's
// poison queue takes it ([IsPoison] is its filter). Package jetstreamsub
// sets up JetStream for the middleware as code.
//
// In [idemserve.ModeTransaction] (the default) the handler runs in a
// transaction, inside [idem.Store.DoOn], retried on serialization
// failures and deadlocks; it writes through [TxFrom] (database/sql,
// [Config].DB) or idempgx.TxFrom (pgx, [Config].Runner =
// idempgx.New(pool, opts)), and the router acks the message after the
// commit. A redelivery that reaches the process while the first
// delivery runs (its ack deadline expired) waits for it in memory, one
// in another process on the row lock, and is then acked from the
// record. [idemserve.ModeClaim] is for a handler that calls a slow
// external service: the middleware commits a claim first, the handler
// passes [ClaimFrom](ctx).RelayKey() to the service as its idempotency
// key, then writes its rows through TxFrom, whose first call begins the
// transaction the claim is completed in. A redelivery that finds the
// claim live is nacked after [Config.RetryAfter], never longer than the
// lease left, not at once.
//
// A record replays for [Config.Retention] (per handler; the Store's by
// default), which must outlive the broker's redelivery horizon. A
// redelivery past it runs again, unless the Store keeps a key memory
// (idem.WithKeyMemory): then it meets [idem.ErrExpired], and the
// middleware acks it without running the handler, logging the reference
// the record kept to what handling it created ([Config.Reference]).
//
// A handler error rolls back its rows, stores nothing (in ModeClaim it
// releases the claim) and is returned, so that the router nacks the
// message and the broker, or watermill's Retry middleware, redelivers
// it.
//
// Messages the handler produces are written in the same transaction,
// through watermill-sql's publisher on it ([Config.Outbox],
// [ForwarderOutbox]): those it returns, in place of the router, which
// would publish them outside the transaction, and those it publishes
// itself through [PublisherFrom]. watermill's forwarder
// (components/forwarder) then publishes them from the outbox to the
// broker. What is stored as a message's response is status 200 and the
// UUIDs of the messages it published, one a line.
//
// docs/messaging.md has the setup on NATS JetStream, RabbitMQ and
// watermill-sql, the poison queue and the forwarder, how long to keep
// the records against the brokers' redelivery, and the same guarantee
// without watermill.
package idemwatermill
