package idemwatermill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// Middleware returns the router middleware that consumes each message
// exactly once, as the package documentation describes. Add it after
// the middlewares that must see every delivery and its outcome (a poison
// queue, Retry), so that they wrap it and Retry runs each attempt in a
// transaction of its own:
//
//	router.AddMiddleware(poisonQueue, retry.Middleware, consume)
func Middleware(cfg Config) (message.HandlerMiddleware, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 && cfg.Store != nil {
		cfg.Timeout = DefaultTimeout
		if cfg.Mode == idemserve.ModeClaim {
			cfg.Timeout = min(DefaultTimeout, cfg.Store.Lease())
		}
	}
	core, err := idemserve.New(idemserve.Config{Layer: "idemwatermill", Store: cfg.Store, DB: cfg.DB, TxOptions: cfg.TxOptions, Runner: cfg.Runner,
		Mode: cfg.Mode, Timeout: cfg.Timeout, RetryAfter: cfg.RetryAfter, Logger: cfg.Logger, Standbys: cfg.Standbys, StandbyWait: cfg.StandbyWait})
	if err != nil {
		return nil, err
	}
	if cfg.Key == nil {
		cfg.Key = func(msg *message.Message) (string, error) { return msg.UUID, nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = core.Logger()
	}
	fp, err := cfg.fingerprinter()
	if err != nil {
		return nil, err
	}
	c := &consumer{cfg: cfg, core: core, fp: fp}
	return c.wrap, nil
}

// consumer is a configured middleware.
type consumer struct {
	cfg  Config
	core *idemserve.Server
	fp   fingerprinter
}

func (c *consumer) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		req, err := c.request(ctx, msg)
		if err != nil {
			c.cfg.Store.Report(ctx, idem.Event{Kind: idem.EventInvalid, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Err: err})
			return nil, err
		}
		var handlerErr error // the handler's own error, from the last attempt
		call := idemserve.Call{Request: &req, Run: func(ctx context.Context) (idem.Response, error) {
			handlerErr = nil
			resp, err := c.run(ctx, msg, h)
			if err != nil {
				handlerErr = err
			}
			return resp, err
		}}
		if c.cfg.Outbox == nil {
			// The handler publishes nothing (it cannot, without an
			// outbox): its record's response is known, and stored with
			// the key's claim.
			answer := consumed
			answer.Reference = c.reference(msg)
			call.Answer = &answer
		}
		if _, err := c.core.Serve(ctx, call); err != nil {
			switch {
			case handlerErr != nil && errors.Is(err, handlerErr):
				return nil, err
			case errors.Is(err, idem.ErrExpired):
				// Applied by an earlier delivery whose record is past its
				// retention and kept by its key memory: the
				// router acks it, and nothing runs again.
				c.cfg.Logger.InfoContext(ctx, "idemwatermill: a redelivery of a message applied before, past its record's retention, is acked without running",
					"message", msg.UUID, "scope", req.Scope, "reference", c.core.Outcome(err).Reference)
				return nil, nil
			case c.core.Outcome(err).Kind == idemserve.Unsealable:
				// Applied by an earlier delivery, whose record this
				// process cannot open (the Server logged it, once per
				// key ID): the router acks it, and nothing runs again; a
				// nack would come back in vain until the key is deployed.
				c.cfg.Logger.InfoContext(ctx, "idemwatermill: a redelivery of a message applied before, whose record cannot be opened here, is acked without running",
					"message", msg.UUID, "scope", req.Scope)
				return nil, nil
			}
			return nil, c.refuse(ctx, msg, err)
		}
		// Committed, now or by an earlier delivery: the router acks the
		// message, and has nothing to publish.
		return nil, nil
	}
}

// request is the idempotency request of msg: its key, the scope, the
// topic it came from and its fingerprint.
func (c *consumer) request(ctx context.Context, msg *message.Message) (idem.Request, error) {
	req := idem.Request{Scope: c.cfg.Scope, Operation: operation(message.SubscribeTopicFromCtx(ctx))}
	if req.Scope == "" {
		if req.Scope = message.HandlerNameFromCtx(ctx); req.Scope == "" {
			return req, fmt.Errorf("idemwatermill: message %s has no scope: it reached the middleware outside a router's handler, which names the scope; set Config.Scope", msg.UUID)
		}
	}
	key, err := c.cfg.Key(msg)
	if err != nil {
		return req, fmt.Errorf("idemwatermill: message %s: Config.Key: %w", msg.UUID, err)
	}
	if err := idem.ValidateKey(key); err != nil {
		return req, fmt.Errorf("idemwatermill: message %s is not processed without a valid key: %w", msg.UUID, err)
	}
	req.Key = key
	if c.cfg.Retention != nil {
		req.Retention = c.cfg.Retention(msg)
	}
	if c.cfg.KeyMemory != nil {
		req.KeyMemory = c.cfg.KeyMemory(msg)
	}
	req.Fingerprint, err = c.fp.of(msg)
	return req, err
}

// operation is what a key is bound to: the topic the message came from,
// or its SHA-256 when it is too long to store.
func operation(topic string) string {
	if len(topic) <= idem.MaxOperationLen {
		return topic
	}
	sum := sha256.Sum256([]byte(topic))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// consumed is the response stored for a message whose handler published
// nothing: status 200, no body.
var consumed = idem.Response{StatusCode: 200}

// run runs the handler on ctx, which carries its transaction, claim and
// request, as msg's context, and writes the messages it returns through
// the outbox. It returns the response stored for msg: status 200 and
// the UUIDs of the messages it published, one a line (consumed when it
// published none).
func (c *consumer) run(ctx context.Context, msg *message.Message, h message.HandlerFunc) (idem.Response, error) {
	pc := &publishing{outbox: c.cfg.Outbox}
	ctx = context.WithValue(ctx, publishingKey{}, pc)
	orig := msg.Context()
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	out, err := h(msg)
	if err != nil {
		return idem.Response{}, err
	}
	if len(out) > 0 {
		if err := pc.publishReturned(ctx, message.PublishTopicFromCtx(orig), out); err != nil {
			return idem.Response{}, err
		}
	}
	return idem.Response{StatusCode: 200, Body: pc.produced(), Reference: c.reference(msg)}, nil
}

// reference is what the record of msg keeps as its reference
// (Config.Reference); "" for none.
func (c *consumer) reference(msg *message.Message) string {
	if c.cfg.Reference == nil {
		return ""
	}
	return c.cfg.Reference(msg)
}

// refuse returns err, an error of Serve's that is not the handler's, for
// the router to nack msg with. When it tells to retry later (the key is
// held by another delivery, was taken over, or is contended, or the
// commit has not reached the standbys), it waits
// the Outcome's RetryAfter first, or until msg's context ends, so that
// the redelivery comes then and not at once.
func (c *consumer) refuse(ctx context.Context, msg *message.Message, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err // the subscriber gave up the message while it waited for another delivery with its key
	}
	switch o := c.core.Outcome(err); o.Kind {
	case idemserve.InFlight, idemserve.LeaseLost, idemserve.Contention, idemserve.NotReplicated:
		t := time.NewTimer(o.RetryAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return fmt.Errorf("idemwatermill: message %s: %w", msg.UUID, err)
}

// IsPoison reports whether err, a handler's error behind the
// middleware, says the message can never be applied, so that a retry is
// pointless: its key was used with another payload ([idem.ErrMismatch],
// [idem.ErrFingerprintChanged] among them), it has no valid key
// ([idem.ErrInvalidKey]), or its request is not valid
// ([idem.ErrInvalidRequest]: a payload that is not the JSON
// PayloadFields select from). It is the filter of
// watermill's poison queue and of its Retry middleware:
//
//	poison, err := middleware.PoisonQueueWithFilter(pub, "poison", idemwatermill.IsPoison)
//	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
//		ShouldRetry: func(p middleware.RetryParams) bool { return !idemwatermill.IsPoison(p.Err) }}
func IsPoison(err error) bool {
	return errors.Is(err, idem.ErrMismatch) || errors.Is(err, idem.ErrInvalidKey) || errors.Is(err, idem.ErrInvalidRequest)
}
