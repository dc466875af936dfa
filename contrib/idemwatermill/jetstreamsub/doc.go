// Package jetstreamsub sets up NATS JetStream for a consumer behind
// idemwatermill's middleware, as code: the stream a consumer reads and
// its durable consumer with explicit acks ([Setup]), the streams the
// outbox's forwarder publishes into ([SetupStream]), a check that the
// middleware's Timeout ends before the consumer's AckWait
// ([CheckTimeout]), and a watermill subscriber bound to the durable
// consumer whose Close is safe ([NewSubscriber]).
//
// watermill-nats v2.1.3's Subscriber.Close closes the channel it
// delivers messages on before it drains its subscription, unordered with
// a delivery that may still be sent on that channel: a data race the
// race detector reports, and a send on a closed channel that can panic.
// The subscriber of [NewSubscriber] never calls it: it hands the router a
// channel of its own, and closes that channel, from the goroutine that
// sends on it, once the NATS connection has drained (the deliveries in
// flight were acked and no other comes). The watermill subscriber's own
// goroutine that would close its channel is left waiting until the
// process exits: one goroutine per subscriber closed.
//
// It is a package of the idemwatermill module, so a consumer on another
// broker links neither nats.go nor watermill-nats.
package jetstreamsub
