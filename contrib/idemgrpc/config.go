package idemgrpc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// Config configures the interceptor. Store, Scope and one of DB and
// Runner are required.
type Config struct {
	// Store records the keys; its table must exist ([idem.Store.Migrate]).
	Store *idem.Store
	// Scope returns who owns the call's key: the authenticated principal,
	// tenant or API client, so that keys never collide across owners and
	// one caller's key never replays another's response. It is required; a
	// service with a single caller sets [SingleTenant]. It gets the call's
	// context (its metadata, its peer, and what the interceptors before
	// this one put there) and the request. An error that carries a gRPC
	// status (from status.Error, say UNAUTHENTICATED) is the answer; any
	// other error is INTERNAL.
	Scope func(ctx context.Context, req any) (string, error)
	// DB is the database/sql pool the transactions run on, the one
	// holding the Store's table and the handler's rows. TxOptions are the
	// options of every transaction, e.g. its isolation level (nil: the
	// database's defaults).
	DB        *sql.DB
	TxOptions *sql.TxOptions
	// Runner, in place of DB and TxOptions, runs the transactions on
	// another driver's pool: idempgx.New(pool, pgx.TxOptions{...}) for
	// pgx, whose handlers get their pgx.Tx from idempgx.TxFrom.
	Runner idem.Runner
	// Mode is [idemserve.ModeTransaction] (the default) or [idemserve.ModeClaim], for handlers
	// that call slow external services.
	Mode idemserve.Mode

	// Required makes a call without a key INVALID_ARGUMENT. When false,
	// such a call runs in a transaction like any other, but with no key
	// recorded, so a retry runs it again.
	Required bool
	// KeyField names a string field of the request messages that carries
	// the key, as AIP-155's request_id does: "request_id". A call whose
	// request has that field set uses its value as the key; one whose
	// request lacks the field, or leaves it empty, uses the
	// [MetadataKey] metadata. When both are set they must be equal. Empty
	// (the default): the metadata alone.
	KeyField string
	// Retention returns how long the record of a call of the full method
	// name replays once completed (idem.Request.Retention); nil, or 0 for
	// a method: the Store's ([idem.WithRetention]). AIP-155 asks that a
	// request_id be honoured for at least an hour; New does not check
	// it.
	Retention func(method string) time.Duration
	// KeyMemory returns how long past its retention the key of a call's
	// record is still refused (FAILED_PRECONDITION: the key expired)
	// instead of run again, per full method name
	// (idem.Request.KeyMemory); nil, or 0 for a method: the Store's
	// ([idem.WithKeyMemory]). The record keeps it: every purge honours
	// it, whatever its own settings.
	KeyMemory func(method string) time.Duration
	// Reference returns, per full method name, the reference to what a
	// call created (its resource name, an ID) read from the handler's OK
	// reply, which the record keeps as idem.Response.Reference; nil, or
	// "" for a reply: none. The record keeps it past its answer within
	// the key memory, and a call refused then (FAILED_PRECONDITION,
	// [ReasonExpired]) carries it in its ErrorInfo's metadata under
	// "reference", so that the client can get the resource. Over
	// idem.MaxReference bytes is an error (INTERNAL, logged, nothing
	// stored).
	Reference func(method string, reply any) string
	// NoSideEffects lists full method names ("/payments.v1.Payments/GetCharge")
	// that pass through untouched, with no transaction ([TxFrom] returns
	// nil) and no key handling. Methods whose descriptor declares
	// option idempotency_level = NO_SIDE_EFFECTS pass through as well.
	NoSideEffects []string
	// FingerprintFields chooses, by full method name
	// ("/payments.v1.Payments/CreateCharge"), the fields of the request
	// message that count in a call's fingerprint, as a FieldMask's paths
	// ("amount", "customer.id"): a retry whose other fields changed (a
	// timestamp, a trace id) replays, and one whose counted fields changed
	// is FAILED_PRECONDITION. FingerprintIgnore names, the same way, the
	// fields that do not count; with both, what counts is the fields, less
	// what is ignored within them. A method named in neither has its whole
	// request counted. Every name of a path but the last is a singular
	// message field, as in a FieldMask; a path that does not resolve in
	// the request message is an error of New when the method's generated
	// package is linked in (protobuf's registry has it), else at its first
	// call (INTERNAL, logged). A counted field that is not populated counts
	// as absent, as proto3 has it (a scalar at its default is not
	// populated). The encoding is this package's canonical one
	// (fingerprint.go), never protobuf's wire bytes.
	//
	// The fingerprint of a method with a selection carries a version made
	// from its paths (idem.VersionedFingerprint), so that after a change
	// of them a retry of a key stored before is FAILED_PRECONDITION with
	// reason [ReasonFingerprintChanged], not a reused key's.
	FingerprintFields map[string]*fieldmaskpb.FieldMask
	FingerprintIgnore map[string]*fieldmaskpb.FieldMask
	// Timeout bounds the work of a call that holds its key, which runs on
	// a context that the client's cancellation or deadline does not end,
	// and how long a duplicate in this process waits for the call ahead of
	// it, as idemserve.Config.Timeout says; then the duplicate is
	// UNAVAILABLE. Default [idemserve.DefaultTimeout].
	Timeout time.Duration
	// RetryAfter is the delay an UNAVAILABLE answer of the interceptor
	// (another call holds the key, took it over, or contention) gives in
	// its RetryInfo and its grpc-retry-pushback-ms trailer, as
	// idemserve.Config.RetryAfter says. Default [idemserve.DefaultRetryAfter].
	RetryAfter time.Duration
	// ReplayMetadata lists the header and trailer metadata keys that are
	// stored with the answer and replayed. Other metadata the handler sets
	// reaches the first caller only. Keys are case-insensitive; keys of
	// gRPC's own ("grpc-...") are refused.
	ReplayMetadata []string
	// StoreServerErrors makes the server-error codes (UNKNOWN, INTERNAL,
	// DATA_LOSS, UNIMPLEMENTED) results too: committed with the handler's
	// rows, stored and replayed. By default they are rolled back and a
	// retry runs the handler again. The codes that ask for a retry
	// (UNAVAILABLE, ABORTED, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED,
	// CANCELLED) are never stored.
	StoreServerErrors bool
	// Logger receives the errors answered with INTERNAL, whose message
	// does not show them to the client, and a claim that could not be
	// released. Default [slog.Default].
	Logger *slog.Logger
	// Standbys, when positive, answers only what survives a failover of
	// a PostgreSQL primary: each answer (a fresh or replayed one, and a
	// reused or expired key) waits until the commit it rests on has
	// reached this many standbys, as idemserve.Config.Standbys says. Past
	// StandbyWait the answer is UNAVAILABLE with RetryInfo
	// ([ReasonNotReplicated]): outcome unknown, retry with the same key.
	// New refuses it on another dialect.
	Standbys int
	// StandbyWait bounds that wait. Default [idemserve.DefaultStandbyWait].
	StandbyWait time.Duration
}

// SingleTenant is the [Config.Scope] of a service with a single caller:
// every call's key is in one scope, "". It costs isolation between
// callers: they all share one key space, so a key one caller sent replays
// its stored response to any other caller who sends the same key and
// request, and tells one who sends another request that the key exists
// (FAILED_PRECONDITION). Use it only where every call comes from one
// trusted client; otherwise return the authenticated caller from
// [Config].Scope.
func SingleTenant(context.Context, any) (string, error) { return "", nil }

// New checks cfg, fills in its defaults and returns the interceptor.
func New(cfg Config) (*Interceptor, error) {
	if cfg.Scope == nil {
		return nil, errors.New("idemgrpc: Config needs a Scope: a function that returns who owns the call's key (the authenticated principal, tenant or API client), so that one caller's key never replays another's response; a service with a single trusted caller sets Scope: idemgrpc.SingleTenant")
	}
	if cfg.KeyField != "" && !protoreflect.Name(cfg.KeyField).IsValid() {
		return nil, fmt.Errorf("idemgrpc: KeyField %q is not a protobuf field name (letters, digits and underscores, e.g. request_id)", cfg.KeyField)
	}
	core, err := idemserve.New(idemserve.Config{Layer: "idemgrpc", Store: cfg.Store, DB: cfg.DB, TxOptions: cfg.TxOptions, Runner: cfg.Runner, Mode: cfg.Mode,
		Timeout: cfg.Timeout, RetryAfter: cfg.RetryAfter, Logger: cfg.Logger, Standbys: cfg.Standbys, StandbyWait: cfg.StandbyWait})
	if err != nil {
		return nil, err
	}
	i := &Interceptor{cfg: cfg, core: core, noSideEffects: map[string]bool{}, replayable: map[string]bool{}}
	for _, m := range cfg.NoSideEffects {
		if err := checkMethod("NoSideEffects", m); err != nil {
			return nil, err
		}
		i.noSideEffects[m] = true
	}
	for m := range cfg.FingerprintFields {
		if err := checkMethod("FingerprintFields", m); err != nil {
			return nil, err
		}
	}
	for m := range cfg.FingerprintIgnore {
		if err := checkMethod("FingerprintIgnore", m); err != nil {
			return nil, err
		}
	}
	i.selections = map[string]*selection{}
	for _, byMethod := range []map[string]*fieldmaskpb.FieldMask{cfg.FingerprintFields, cfg.FingerprintIgnore} {
		for m := range byMethod {
			if i.selections[m] != nil {
				continue
			}
			sel, err := newSelection(m, cfg.FingerprintFields[m], cfg.FingerprintIgnore[m])
			if err != nil {
				return nil, err
			}
			i.selections[m] = sel
		}
	}
	for _, k := range cfg.ReplayMetadata {
		k = strings.ToLower(k)
		if err := checkMetadataKey(k); err != nil {
			return nil, fmt.Errorf("idemgrpc: ReplayMetadata: %w", err)
		}
		i.replayable[k] = true
	}
	return i, nil
}

// checkMethod refuses m, named in the Config's field what, when it is
// not a full method name.
func checkMethod(what, m string) error {
	if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 {
		return fmt.Errorf("idemgrpc: %s holds %q, which is not a full method name such as /payments.v1.Payments/GetCharge", what, m)
	}
	return nil
}

// checkMetadataKey refuses a key that is not a valid metadata key, or is
// one of gRPC's own.
func checkMetadataKey(k string) error {
	if k == "" {
		return errors.New("an empty metadata key")
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("metadata key %q holds %q: only letters, digits, '-', '_' and '.'", k, c)
		}
	}
	if strings.HasPrefix(k, "grpc-") {
		return fmt.Errorf("metadata key %q is gRPC's own: it is never stored or replayed", k)
	}
	return nil
}
