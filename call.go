package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
)

// Codec encodes the result of a typed call ([Call]) to be stored, and
// decodes it for a replay. ContentType names the encoding: it is stored
// with the result, and a replay whose stored result has another is an
// error rather than a misread value.
type Codec interface {
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default [Codec] of [Call]: encoding/json, stored as
// application/json.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) ContentType() string                { return "application/json" }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// CallOption configures one [Call].
type CallOption func(*callConfig)

type callConfig struct {
	codec Codec
	// reference is WithReference's function, over fn's value.
	reference func(v any) (string, error)
}

// WithCodec makes a [Call] store its result with c instead of [JSON].
func WithCodec(c Codec) CallOption { return func(cc *callConfig) { cc.codec = c } }

// WithReference makes a [Call] record ref(v) of fn's value v as the
// record's [Response.Reference]: what the call created (an ID, a path),
// which a replay returns with the value and a retry past the retention,
// refused within the key memory, gets in its [ExpiredError]. T must be
// the Call's type: another is an error of the Call's, before anything is
// stored.
func WithReference[T any](ref func(v T) string) CallOption {
	return func(cc *callConfig) {
		cc.reference = func(v any) (string, error) {
			t, ok := v.(T)
			if !ok {
				var want T
				return "", fmt.Errorf("idem: WithReference is for values of type %T, the Call's are %T; nothing was stored", want, v)
			}
			return ref(t), nil
		}
	}
}

// Call runs fn at most once per (Scope, Key) among all transactions that
// commit, as [Store.Do] does, for a function whose result is a value of
// any type rather than an HTTP response: a job, a service method, a
// queue worker's step. fn's result is encoded with the [Codec] ([JSON]
// unless [WithCodec] says otherwise) and stored in tx, which must be an
// open transaction, as Do's. Call returns fn's value and false when fn
// ran, and the stored value, decoded, and true when an earlier execution
// completed (fn did not run). So a replay returns what the codec decodes:
// T's exported fields for JSON; give T a form that round-trips.
//
// Call is built on Do and behaves as it does: another Operation or
// Fingerprint is [ErrMismatch], a live claim of [Store.Begin] an
// [*InFlightError], a key past its retention within the key memory
// [ErrExpired], and with [WithSealer] the stored value is sealed. An error
// of fn, or of encoding its value, is returned and nothing is stored: the
// caller rolls back. Unlike Do, Call refuses an empty Operation
// ([ErrInvalidRequest]): what keeps a key's typed result from being
// replayed into another type is the Operation it is bound to. The
// stored record is a response of status 200 whose Content-Type is the
// codec's and whose body is the encoded value, so `idem inspect` shows
// it.
func Call[T any](ctx context.Context, s *Store, tx DBTX, req Request, fn func(ctx context.Context) (T, error), opts ...CallOption) (T, bool, error) {
	var zero T
	tx, err := txOf(tx, "Call")
	if err != nil {
		return zero, false, err
	}
	return CallOn(ctx, s, sqlTx{sqlConn{tx}}, req, fn, opts...)
}

// CallOn is [Call] in tx, the caller's open transaction through any
// driver's adapter (idempgx.Tx for a pgx.Tx), as [Store.DoOn] is Do's.
func CallOn[T any](ctx context.Context, s *Store, tx Tx, req Request, fn func(ctx context.Context) (T, error), opts ...CallOption) (T, bool, error) {
	var zero T
	cc := callConfig{codec: JSON}
	for _, o := range opts {
		o(&cc)
	}
	switch {
	case s == nil:
		return zero, false, errors.New("idem: Call needs a Store, got nil")
	case fn == nil:
		return zero, false, errors.New("idem: Call needs a function to run, got nil")
	case cc.codec == nil:
		return zero, false, errors.New("idem: WithCodec needs a Codec, got nil")
	case req.Operation == "":
		return zero, false, fmt.Errorf("%w: Call needs an Operation (what the key is bound to, e.g. \"job: monthly invoice\"): it keeps a typed call's records apart from Do's and from another type's, which would not decode", ErrInvalidRequest)
	}
	contentType := cc.codec.ContentType()
	var value T
	res, err := s.DoOn(ctx, tx, req, func(ctx context.Context) (Response, error) {
		v, err := fn(ctx)
		if err != nil {
			return Response{}, err
		}
		body, err := cc.codec.Marshal(v)
		if err != nil {
			return Response{}, fmt.Errorf("idem: Call: encoding the result as %s: %w; nothing was stored", contentType, err)
		}
		var ref string
		if cc.reference != nil {
			if ref, err = cc.reference(v); err != nil {
				return Response{}, err
			}
		}
		value = v
		return Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {contentType}}, Body: body, Reference: ref}, nil
	})
	if err != nil {
		return zero, false, err
	}
	if !res.Replayed {
		return value, false, nil
	}
	stored := res.Header.Get("Content-Type")
	if res.StatusCode != http.StatusOK || !sameMediaType(stored, contentType) {
		return zero, true, &Error{Op: "replay", Scope: req.Scope, Key: req.Key,
			Err:    errors.New("the stored result is not one of Call with this codec"),
			Detail: fmt.Sprintf("the key's record holds a response of status %d and Content-Type %q; Call with its codec stores status 200 and %q", res.StatusCode, stored, contentType),
			Hint:   "a key used by Do or another codec for this operation cannot replay into this type: give typed calls an Operation of their own"}
	}
	if err := cc.codec.Unmarshal(res.Body, &value); err != nil {
		return zero, true, &Error{Op: "replay", Scope: req.Scope, Key: req.Key, Err: err,
			Detail: fmt.Sprintf("decoding the stored result (%d bytes of %s) into %T failed", len(res.Body), contentType, value),
			Hint:   "the result's type changed since it was stored: keep T decodable from what earlier releases stored while their records are retained"}
	}
	return value, true, nil
}

// sameMediaType reports whether two Content-Types name one media type
// with the same parameters.
func sameMediaType(a, b string) bool {
	if a == b {
		return true
	}
	ma, pa, errA := mime.ParseMediaType(a)
	mb, pb, errB := mime.ParseMediaType(b)
	if errA != nil || errB != nil || ma != mb || len(pa) != len(pb) {
		return false
	}
	for k, v := range pa {
		if pb[k] != v {
			return false
		}
	}
	return true
}
