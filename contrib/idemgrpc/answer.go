package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem"
)

// MetadataReplayed is the trailer metadata key of a replay: a call whose
// answer comes from an earlier execution carries
// idempotent-replayed: true, and its handler did not run.
const MetadataReplayed = "idempotent-replayed"

// answer is what a call answered: a reply message with status OK, or a
// status that is not OK, and the metadata the handler set.
type answer struct {
	reply   any            // with an OK status: the reply message
	status  *status.Status // never nil
	err     error          // the handler's own error, when it ran and failed
	header  metadata.MD
	trailer metadata.MD
}

// The fields of an [idem.Response]'s Header that hold an answer, beside
// the metadata kept under the prefixes. No metadata key holds a colon, so
// no key collides with the fields.
const (
	fieldFormat    = "idemgrpc"        // the encoding's version: "1"
	fieldCode      = "grpc-code"       // the status code, in decimal
	fieldReplyType = "grpc-reply-type" // with OK: the reply message's full name
	prefixHeader   = "header:"         // header metadata, key after the prefix
	prefixTrailer  = "trailer:"        // trailer metadata
	formatVersion  = "1"
)

// deterministic encodes what is stored: the same answer is the same bytes
// within a binary, which is all storage needs (the fingerprint has its
// own canonical form, fingerprint.go).
var deterministic = proto.MarshalOptions{Deterministic: true}

// response encodes a as the [idem.Response] to store: StatusCode is the
// HTTP status that google.rpc.Code gives the code (200 for OK, 400 for
// INVALID_ARGUMENT, ...), so that `idem inspect` reads a gRPC record as it
// would the same outcome over HTTP; Header holds the exact code, the reply
// message's type and the metadata keep allows; Body is the reply message
// (OK) or the google.rpc.Status (code, message, details), encoded.
func (a *answer) response(keep func(key string) bool) (idem.Response, error) {
	code := a.status.Code()
	h := http.Header{fieldFormat: {formatVersion}, fieldCode: {strconv.FormatUint(uint64(code), 10)}}
	var (
		body []byte
		err  error
	)
	if code == codes.OK {
		m, ok := a.reply.(proto.Message)
		if !ok || m == nil {
			return idem.Response{}, fmt.Errorf("idemgrpc: the handler's reply is a %T, not a protocol buffer message: idemgrpc stores replies in their protobuf encoding", a.reply)
		}
		h[fieldReplyType] = []string{string(m.ProtoReflect().Descriptor().FullName())}
		body, err = deterministic.Marshal(m)
	} else {
		body, err = deterministic.Marshal(a.status.Proto())
	}
	if err != nil {
		return idem.Response{}, fmt.Errorf("idemgrpc: encode the answer (%v) to store it: %w", code, err)
	}
	putMetadata(h, prefixHeader, a.header, keep)
	putMetadata(h, prefixTrailer, a.trailer, keep)
	return idem.Response{StatusCode: httpStatus(code), Header: h, Body: body}, nil
}

func putMetadata(h http.Header, prefix string, md metadata.MD, keep func(string) bool) {
	for k, vs := range md {
		if keep(k) {
			h[prefix+k] = append([]string(nil), vs...)
		}
	}
}

// errCorrupt is wrapped by the errors of answerOf.
var errCorrupt = errors.New("idemgrpc: the stored answer cannot be read")

// answerOf decodes a stored [idem.Response] into the answer it holds, its
// reply message a new message of the type it was stored with, found in
// types.
func answerOf(r idem.Response, types protoregistry.MessageTypeResolver) (*answer, error) {
	if v := r.Header[fieldFormat]; len(v) != 1 || v[0] != formatVersion {
		return nil, fmt.Errorf("%w: it was not written by this version of idemgrpc (format %q, want %q)", errCorrupt, v, formatVersion)
	}
	v := r.Header[fieldCode]
	if len(v) != 1 {
		return nil, fmt.Errorf("%w: no status code", errCorrupt)
	}
	n, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%w: status code %q", errCorrupt, v[0])
	}
	code := codes.Code(n)
	if r.StatusCode != httpStatus(code) {
		return nil, fmt.Errorf("%w: HTTP status %d does not go with code %v", errCorrupt, r.StatusCode, code)
	}
	a := &answer{}
	for name, vs := range r.Header {
		switch {
		case strings.HasPrefix(name, prefixHeader):
			a.header = appendMD(a.header, name[len(prefixHeader):], vs)
		case strings.HasPrefix(name, prefixTrailer):
			a.trailer = appendMD(a.trailer, name[len(prefixTrailer):], vs)
		}
	}
	if code != codes.OK {
		st := &spb.Status{}
		if err := proto.Unmarshal(r.Body, st); err != nil {
			return nil, fmt.Errorf("%w: status: %v", errCorrupt, err)
		}
		if codes.Code(st.GetCode()) != code {
			return nil, fmt.Errorf("%w: status code %d does not match %v", errCorrupt, st.GetCode(), code)
		}
		a.status = status.FromProto(st)
		return a, nil
	}
	t := r.Header[fieldReplyType]
	if len(t) != 1 {
		return nil, fmt.Errorf("%w: no reply type", errCorrupt)
	}
	mt, err := types.FindMessageByName(protoreflect.FullName(t[0]))
	if err != nil {
		return nil, fmt.Errorf("%w: the reply's type %s is not linked into this binary (%v); import the package that defines it", errCorrupt, t[0], err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, m); err != nil {
		return nil, fmt.Errorf("%w: reply %s: %v", errCorrupt, t[0], err)
	}
	a.reply, a.status = m, status.New(codes.OK, "")
	return a, nil
}

func appendMD(md metadata.MD, k string, vs []string) metadata.MD {
	if md == nil {
		md = metadata.MD{}
	}
	md[k] = append(md[k], vs...)
	return md
}

// httpStatus is the HTTP status google.rpc.Code documents for code; 500
// for a code it does not define.
func httpStatus(code codes.Code) int {
	switch code {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // UNKNOWN, INTERNAL, DATA_LOSS and codes gRPC does not define
}

// send writes a's metadata to the call's stream and returns what the
// interceptor returns: the reply, or the status as an error. A replay's
// trailer says so ([MetadataReplayed]). The metadata goes through
// SetHeader and SetTrailer, so an answer without header metadata stays
// trailers-only, as gRPC's retry needs.
func (a *answer) send(ctx context.Context, replayed bool) (any, error) {
	if s := grpc.ServerTransportStreamFromContext(ctx); s != nil {
		if a.header.Len() > 0 {
			_ = s.SetHeader(a.header) // fails only once the stream is gone
		}
		trailer := a.trailer
		if replayed {
			trailer = metadata.Join(trailer, metadata.Pairs(MetadataReplayed, "true"))
		}
		if trailer.Len() > 0 {
			_ = s.SetTrailer(trailer)
		}
	}
	switch {
	case a.err != nil:
		return nil, a.err
	case a.status.Code() != codes.OK:
		return nil, a.status.Err()
	}
	return a.reply, nil
}

// recorder is the grpc.ServerTransportStream a handler behind the
// interceptor sees: it keeps the metadata the handler sets (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer) until the answer is committed, so that
// nothing reaches the client before then.
type recorder struct {
	method  string
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
	sent    bool // SendHeader was called
}

var errHeaderSent = status.Error(codes.Internal, "idemgrpc: SendHeader was already called; header metadata can be set only before")

func (r *recorder) Method() string { return r.method }

func (r *recorder) SetHeader(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent {
		return errHeaderSent
	}
	r.header = metadata.Join(r.header, md)
	return nil
}

// SendHeader records md like SetHeader: the header is sent with the
// answer, after the commit.
func (r *recorder) SendHeader(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent {
		return errHeaderSent
	}
	r.header, r.sent = metadata.Join(r.header, md), true
	return nil
}

func (r *recorder) SetTrailer(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trailer = metadata.Join(r.trailer, md)
	return nil
}

// answer is what the handler answered, with the metadata it set.
func (r *recorder) answer(reply any, err error) *answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := &answer{reply: reply, status: statusOf(err), err: err, header: r.header, trailer: r.trailer}
	if err != nil {
		a.reply = nil
	}
	return a
}

// statusOf is the status gRPC sends for a handler's error: its own status,
// CANCELLED or DEADLINE_EXCEEDED for a context's error, UNKNOWN for any
// other; OK for nil.
func statusOf(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}
