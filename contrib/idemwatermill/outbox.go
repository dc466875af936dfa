package idemwatermill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemserve"
)

// Outbox builds the publisher that writes a handler's messages in its
// transaction, tx: watermill-sql's publisher on tx, usually wrapped in
// watermill's forwarder publisher, as [ForwarderOutbox] builds it. It is
// called once per attempt that publishes (a transaction retried after a
// serialization failure is another attempt), with tx the handler's
// transaction (a *sql.Tx or a pgx.Tx, as watermill-sql's executor). The
// publisher must write through tx and nothing else: the messages must
// commit with the handler's rows and record, or not at all.
type Outbox func(tx wsql.ContextExecutor) (message.Publisher, error)

// ForwarderOutbox returns the [Outbox] of watermill's forwarder
// (components/forwarder): each message is wrapped in an envelope that
// names its topic and written, in the handler's transaction, to the
// watermill-sql table of forwarderTopic through a publisher of schema
// (wsql.DefaultPostgreSQLSchema{} or wsql.DefaultMySQLSchema{}, the one
// of the database; its tables must exist, since a publisher on a
// transaction does not create them). A forwarder.Forwarder that
// subscribes to forwarderTopic with a watermill-sql subscriber publishes
// them to the broker once they are committed. logger may be nil.
func ForwarderOutbox(schema wsql.SchemaAdapter, forwarderTopic string, logger watermill.LoggerAdapter) Outbox {
	return func(tx wsql.ContextExecutor) (message.Publisher, error) {
		pub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: schema}, logger)
		if err != nil {
			return nil, err
		}
		return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}), nil
	}
}

type publishingKey struct{}

// publishing is the outbox of one attempt at a message: its publisher,
// built on the attempt's transaction when the handler first publishes,
// and the UUIDs of what it published.
type publishing struct {
	outbox Outbox
	mu     sync.Mutex
	pub    message.Publisher // nil until the first publish
	uuids  []string
}

// PublisherFrom returns the publisher through which the handler whose
// context is ctx (msg.Context()) publishes messages to any topic in its
// own transaction: the [Config.Outbox] on that transaction. The
// messages commit with the handler's rows and are sent on by the
// forwarder; a delivery that fails or is rolled back publishes nothing,
// and a redelivery of a message that committed does not run the
// handler, so each is published once. In [idemserve.ModeClaim] it
// begins the transaction, as [TxFrom] does. Closing it does nothing.
//
// It fails outside the middleware, without a Config.Outbox, and when the
// transaction could not begin.
func PublisherFrom(ctx context.Context) (message.Publisher, error) {
	p, _ := ctx.Value(publishingKey{}).(*publishing)
	if p == nil {
		return nil, errors.New("idemwatermill: PublisherFrom outside the middleware's handler: pass it msg.Context()")
	}
	return p.publisher(ctx)
}

// publisher returns the attempt's publisher, building it on the first
// call.
func (p *publishing) publisher(ctx context.Context) (message.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub != nil {
		return p.pub, nil
	}
	if p.outbox == nil {
		return nil, errors.New("idemwatermill: the handler publishes messages, and Config.Outbox is nil: set it (ForwarderOutbox), so that they are written in the handler's transaction")
	}
	tx, err := executorFrom(ctx)
	if err != nil {
		return nil, err
	}
	pub, err := p.outbox(tx)
	if err != nil {
		return nil, fmt.Errorf("idemwatermill: Config.Outbox: %w", err)
	}
	p.pub = recording{p: p, pub: pub}
	return p.pub, nil
}

// executorFrom is the handler's transaction as watermill-sql's executor.
func executorFrom(ctx context.Context) (wsql.ContextExecutor, error) {
	if tx := idemserve.SQLTxFrom(ctx); tx != nil {
		return wsql.TxFromStdSQL(tx), nil
	}
	if tx, ok := idemserve.TxFrom[pgx.Tx](ctx); ok {
		return wsql.TxFromPgx(tx), nil
	}
	return nil, errors.New("idemwatermill: the handler has no transaction to publish in: it could not begin, or the Runner's transactions are neither database/sql's nor pgx's")
}

// publishReturned publishes the messages a handler returned to topic,
// the handler's publish topic, through the outbox, in place of the
// router, which would publish them outside the transaction.
func (p *publishing) publishReturned(ctx context.Context, topic string, msgs []*message.Message) error {
	pub, err := p.publisher(ctx)
	if err != nil {
		return err
	}
	if topic == "" {
		return fmt.Errorf("idemwatermill: the handler returned %d messages and has no publish topic: add it with router.AddHandler, or publish through PublisherFrom", len(msgs))
	}
	return pub.Publish(topic, msgs...)
}

// produced is the stored body: the UUIDs published, one a line.
func (p *publishing) produced() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.uuids) == 0 {
		return nil
	}
	return []byte(strings.Join(p.uuids, "\n"))
}

// recording is the outbox's publisher, recording what it publishes.
type recording struct {
	p   *publishing
	pub message.Publisher
}

func (r recording) Publish(topic string, msgs ...*message.Message) error {
	if err := r.pub.Publish(topic, msgs...); err != nil {
		return err
	}
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	for _, m := range msgs {
		r.p.uuids = append(r.p.uuids, m.UUID)
	}
	return nil
}

// Close does nothing: the publisher lives as long as the attempt's
// transaction.
func (recording) Close() error { return nil }
