package jetstreamsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/contrib/idemwatermill"
	"github.com/idemkit/idem/idemserve"
)

// DefaultAckWait is JetStream's AckWait when a consumer sets none.
const DefaultAckWait = 30 * time.Second

// Setup creates the stream, or updates it to stream, and its durable
// consumer, or updates it to consumer, and returns the consumer: the
// setup a consumer behind the middleware reads through, safe to run from
// every process at start. consumer must be durable (Durable set) with
// explicit acks (AckPolicy AckExplicitPolicy, which is also the zero
// value), so that the router acks each message after its commit and a
// delivery not acked within AckWait is redelivered; Setup refuses
// another.
func Setup(ctx context.Context, js jetstream.JetStream, stream jetstream.StreamConfig, consumer jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	switch {
	case consumer.Durable == "":
		return nil, errors.New("jetstreamsub: the consumer needs a Durable name, shared by every process of the consumer, so that a message goes to one of them and is redelivered until acked")
	case consumer.AckPolicy != jetstream.AckExplicitPolicy:
		return nil, fmt.Errorf("jetstreamsub: the consumer's AckPolicy is %v; the middleware needs explicit acks (AckExplicitPolicy), each after its message's commit", consumer.AckPolicy)
	}
	if _, err := SetupStream(ctx, js, stream); err != nil {
		return nil, err
	}
	c, err := js.CreateOrUpdateConsumer(ctx, stream.Name, consumer)
	if err != nil {
		return nil, fmt.Errorf("jetstreamsub: consumer %s of stream %s: %w", consumer.Durable, stream.Name, err)
	}
	return c, nil
}

// SetupStream creates the stream, or updates it to stream: for a
// consumer's stream, and for each stream the outbox's forwarder
// publishes into (a subject no stream holds is published to nobody, and
// JetStream's publish fails).
func SetupStream(ctx context.Context, js jetstream.JetStream, stream jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("jetstreamsub: stream %s: %w", stream.Name, err)
	}
	return s, nil
}

// CheckTimeout reports an error when the middleware of cfg may run a
// message past the AckWait of consumer (JetStream's default when it sets
// none): its Timeout, or its default ([idemwatermill.DefaultTimeout],
// the Store's lease in ModeClaim when shorter), must be below it, so that
// the handler's context ends before JetStream gives the message to
// another consumer; and in ModeClaim the Store's lease must not exceed it
// either, or a redelivery meets a live claim and is nacked until it ends.
func CheckTimeout(cfg idemwatermill.Config, consumer jetstream.ConsumerConfig) error {
	ackWait := consumer.AckWait
	if ackWait == 0 {
		ackWait = DefaultAckWait
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = idemwatermill.DefaultTimeout
		if cfg.Mode == idemserve.ModeClaim && cfg.Store != nil {
			timeout = min(timeout, cfg.Store.Lease())
		}
	}
	if timeout >= ackWait {
		return fmt.Errorf("jetstreamsub: the middleware's Timeout, %v, is not below the AckWait of consumer %s, %v: a message still running when the ack deadline passes is given to another consumer; lower Config.Timeout or raise AckWait", timeout, consumer.Durable, ackWait)
	}
	if cfg.Mode == idemserve.ModeClaim && cfg.Store != nil && cfg.Store.Lease() > ackWait {
		return fmt.Errorf("jetstreamsub: the Store's lease, %v, exceeds the AckWait of consumer %s, %v: a redelivery after the ack deadline meets a live claim and is nacked until the lease ends; lower the lease (idem.WithLease) or raise AckWait", cfg.Store.Lease(), consumer.Durable, ackWait)
	}
	return nil
}

// SubscriberConfig configures [NewSubscriber].
type SubscriberConfig struct {
	// URL is the NATS server's.
	URL string
	// Durable is the durable consumer the subscriber is bound to, in the
	// stream named after each topic it subscribes to (as [Setup] makes
	// it).
	Durable string
	// AckWait is the consumer's: the subscriber waits that long for the
	// router's ack of a message. Default [DefaultAckWait].
	AckWait time.Duration
	// PullMaxMessages is how many messages the client buffers: a
	// buffered message is already delivered, and its AckWait runs while
	// it waits. Default 16.
	PullMaxMessages int
	// Unmarshaler turns a JetStream message into watermill's (to keep
	// Nats-Msg-Id, say); default watermill-nats's.
	Unmarshaler wjs.Unmarshaler
	// Logger is watermill's; default none.
	Logger watermill.LoggerAdapter
	// Options are nats.go's, for the subscriber's own connection (its
	// credentials, say).
	Options []nats.Option
}

// NewSubscriber returns a watermill subscriber on cfg.URL, with a
// connection of its own, bound to the durable consumer cfg.Durable of
// each topic's stream, whose Close drains that connection before it
// closes the channel it delivers on (see the package documentation).
func NewSubscriber(cfg SubscriberConfig) (message.Subscriber, error) {
	if cfg.Durable == "" {
		return nil, errors.New("jetstreamsub: SubscriberConfig needs the Durable consumer to bind to")
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.PullMaxMessages == 0 {
		cfg.PullMaxMessages = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(cfg.URL, append(cfg.Options, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))...)
	if err != nil {
		return nil, fmt.Errorf("jetstreamsub: connect to %s: %w", cfg.URL, err)
	}
	sub, err := wjs.NewSubscriber(wjs.SubscriberConfig{Conn: nc, Logger: cfg.Logger, AckWaitTimeout: cfg.AckWait, Unmarshaler: cfg.Unmarshaler,
		ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
			c, err := js.Consumer(ctx, topic, cfg.Durable)
			return c, nil, err
		},
		ConsumeOptions: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(cfg.PullMaxMessages)}})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &drained{sub: sub, nc: nc, closed: closed, stop: make(chan struct{})}, nil
}

// drained is a watermill-nats JetStream subscriber whose own Close is
// never called (see the package documentation).
type drained struct {
	sub    *wjs.Subscriber
	nc     *nats.Conn
	closed chan struct{} // by the connection's ClosedHandler
	stop   chan struct{}
	once   sync.Once
}

// Subscribe subscribes to topic, through the durable consumer of the
// stream named topic.
func (d *drained) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := d.sub.Subscribe(context.WithoutCancel(ctx), topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for {
			select {
			case m := <-in:
				select {
				case out <- m:
				case <-d.stop:
					return
				}
			case <-d.stop:
				return
			}
		}
	}()
	return out, nil
}

// Close drains the connection (the deliveries in flight finish and are
// acked or nacked; no other comes), waits up to 20 s for it to close,
// then closes the channels Subscribe returned.
func (d *drained) Close() error {
	var err error
	d.once.Do(func() {
		defer close(d.stop)
		if err = d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			return
		}
		err = nil
		select {
		case <-d.closed:
		case <-time.After(20 * time.Second):
			err = errors.New("jetstreamsub: the NATS connection did not drain within 20s")
		}
	})
	return err
}
