// Package withoutwatermill shows the guarantee of package idemwatermill
// without watermill, in its examples: a NATS JetStream consumer on
// nats.go and a Kafka consumer on franz-go that apply each message once,
// with idem.RunTx and Store.Do keyed by the producer's message id, and
// ack it (commit its offset) only after the commit. It has no API of its
// own; docs/messaging.md explains the examples.
package withoutwatermill
