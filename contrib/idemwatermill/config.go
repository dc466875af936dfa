package idemwatermill

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// Config configures the middleware. Store and one of DB and Runner are
// required.
type Config struct {
	// Store records the messages' keys; its table must exist
	// ([idem.Store.Migrate]), in the database the handler's rows are in.
	Store *idem.Store
	// DB is the database/sql pool the transactions run on, the one
	// holding the Store's table and the handler's rows; TxOptions are the
	// options of every transaction of the handler's (nil: the database's
	// defaults).
	DB        *sql.DB
	TxOptions *sql.TxOptions
	// Runner, in place of DB and TxOptions, runs the transactions on
	// another driver's pool: idempgx.New(pool, pgx.TxOptions{...}) for
	// pgx, whose handlers get their pgx.Tx from
	// idempgx.TxFrom(msg.Context()).
	Runner idem.Runner
	// Mode is [idemserve.ModeTransaction] (the default): the handler runs
	// in a transaction, inside [idem.Store.DoOn]; or
	// [idemserve.ModeClaim], for a handler that calls a slow external
	// service: it runs under a claim, with no transaction open until it
	// asks for one ([TxFrom]).
	Mode idemserve.Mode

	// Key returns a message's idempotency key. Default: the message's
	// UUID. [MetadataKey] reads it from a metadata field instead, such as
	// a producer's idempotency key. A message whose key is empty or not
	// valid ([idem.ValidateKey]), or for which Key fails, is an error:
	// it is never processed without its key.
	Key func(msg *message.Message) (string, error)
	// Scope is who owns the keys: two consumers of one message with
	// different scopes each apply it once. Default: the name of the
	// router's handler (message.HandlerNameFromCtx), so that every
	// handler of a router has its own; a message that reaches the
	// middleware outside a router's handler, with no name, is an error.
	Scope string
	// Fingerprint names the metadata fields that, beside the payload,
	// make up the request a key is bound to: the same key with another
	// payload or another value of one of these fields is
	// [idem.ErrMismatch], and is not applied. The fingerprint is
	// idem.Fingerprint of the payload (or what PayloadFields and
	// PayloadIgnore select of it), then of each named field, in the order
	// named, its name and its value (msg.Metadata.Get: an absent field
	// and an empty one are both ""); with a payload selection,
	// idem.VersionedFingerprint of the same parts ([FingerprintOf]
	// computes it, for a producer too).
	Fingerprint []string
	// PayloadFields names, by JSON Pointer (RFC 6901: "/order_id"), the
	// members of a JSON payload that count in the fingerprint, and
	// PayloadIgnore those that do not (a producer's timestamp, a trace
	// id), as idemhttp's FingerprintFields and FingerprintIgnore do
	// (package jsonsel says exactly what is hashed; a counted member that
	// is absent counts as absent). With either set, a payload that is not
	// valid JSON, or in which a counted member appears twice, is an error
	// wrapping [idem.ErrInvalidRequest] ([IsPoison]), never digested
	// whole. The fingerprint then carries a version made from these and
	// Fingerprint, so that after a change of them a redelivery of a
	// message recorded before is [idem.ErrFingerprintChanged] (which
	// [IsPoison] sends to the poison queue with that reason) rather than
	// a plain mismatch. Without them, the whole payload counts, byte for
	// byte, and the fingerprint is unversioned, as before they existed:
	// changing Fingerprint alone makes a redelivery of a message recorded
	// before a plain [idem.ErrMismatch].
	PayloadFields []string
	PayloadIgnore []string
	// Retention is how long the record of a message replays (its
	// redeliveries are acked without running the handler): it must
	// outlive the broker's redelivery horizon (docs/messaging.md). nil,
	// or 0 returned: the Store's. It may read the message's context for
	// its handler (message.HandlerNameFromCtx) or topic, to keep one
	// consumer's records longer than another's.
	Retention func(msg *message.Message) time.Duration
	// KeyMemory is how long past its retention the key of a message's
	// record is still refused (idem.ErrExpired: a redelivery is acked
	// without running the handler) instead of run again, per handler or
	// topic as Retention is (idem.Request.KeyMemory). nil, or 0
	// returned: the Store's ([idem.WithKeyMemory]). The record keeps it:
	// every purge honours it, whatever its own settings.
	KeyMemory func(msg *message.Message) time.Duration
	// Reference returns the reference to what handling msg creates (an
	// order's ID from the payload or metadata), which the record keeps
	// as idem.Response.Reference past its retention within the key
	// memory; nil, or "" returned: none. A redelivery refused then
	// (idem.ErrExpired) is acked with a log line that names it. Over
	// idem.MaxReference bytes is an error of the message's handling
	// (nacked, nothing stored).
	Reference func(msg *message.Message) string
	// Outbox builds the publisher, on the handler's transaction, through
	// which the messages that the handler returns and those it publishes
	// itself ([PublisherFrom]) are written, so that they commit with its
	// rows and its record or not at all: [ForwarderOutbox] for
	// watermill's forwarder. Without it, a handler that returns messages
	// fails.
	Outbox Outbox

	// Timeout bounds the work of a message once it holds its key, which
	// runs on a context that the subscriber's cancellation does not end,
	// and how long a redelivery that reaches this process while the
	// first delivery runs waits for it, when the Store has no lock
	// timeout, as idemserve.Config.Timeout says. Keep it below the
	// broker's ack deadline (JetStream's AckWait, watermill-sql's
	// AckDeadline, both 30 s by default), so that the handler's context
	// ends before the broker gives the message to another consumer;
	// package jetstreamsub checks it against a JetStream consumer's.
	// Default [DefaultTimeout], 20 s, below those defaults; in ModeClaim
	// at most the Store's lease, which is its default when shorter.
	Timeout time.Duration
	// RetryAfter is how long a redelivery that finds the key held by
	// another delivery (in flight, taken over) or contended waits before
	// the middleware returns its error, so that the message is nacked
	// then, not at once; never longer than the lease left on the claim
	// that holds the key. Default [idemserve.DefaultRetryAfter].
	RetryAfter time.Duration
	// Logger receives what goes wrong after a message's outcome is
	// decided (a claim that could not be released). Default
	// [slog.Default].
	Logger *slog.Logger
	// Standbys, when positive, acks only what survives a failover of a
	// PostgreSQL primary: a message is acked once the commit that
	// applied it (or, for a redelivery, the record that says it was
	// applied) has reached this many standbys, as
	// idemserve.Config.Standbys says. Past StandbyWait the message is
	// nacked (after RetryAfter), for its redelivery to replay or apply
	// it. Middleware refuses it on another dialect.
	Standbys int
	// StandbyWait bounds that wait. Default [idemserve.DefaultStandbyWait].
	StandbyWait time.Duration
}

// DefaultTimeout is the default of [Config].Timeout: 20 s, below the
// 30 s that JetStream's AckWait and watermill-sql's AckDeadline default
// to, so that the defaults keep the handler within the ack deadline.
const DefaultTimeout = 20 * time.Second

// MetadataKey returns a [Config.Key] that reads a message's key from
// its metadata field name: an idempotency key its producer set, say. A
// message without the field has an empty key, which is an error.
func MetadataKey(name string) func(msg *message.Message) (string, error) {
	return func(msg *message.Message) (string, error) { return msg.Metadata.Get(name), nil }
}

// check refuses a Config the middleware cannot use, before
// idemserve.New checks the rest.
func (cfg Config) check() error {
	switch {
	case len(cfg.Scope) > idem.MaxScopeLen:
		return fmt.Errorf("idemwatermill: Config.Scope is %d bytes, at most %d allowed", len(cfg.Scope), idem.MaxScopeLen)
	case !utf8.ValidString(cfg.Scope) || strings.ContainsRune(cfg.Scope, 0):
		return errors.New("idemwatermill: Config.Scope must be valid UTF-8 without NUL bytes")
	}
	if _, err := cfg.fingerprinter(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range cfg.Fingerprint {
		switch {
		case f == "":
			return errors.New("idemwatermill: Config.Fingerprint names an empty metadata field")
		case seen[f]:
			return fmt.Errorf("idemwatermill: Config.Fingerprint names the metadata field %q twice", f)
		}
		seen[f] = true
	}
	return nil
}
