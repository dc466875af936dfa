package idemclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderIdempotencyKey is the request header field that carries the key.
const HeaderIdempotencyKey = "Idempotency-Key"

// HeaderAttempt is the request header field that numbers a retry: absent
// on the first attempt of a request, 2 on the second, and so on (an
// sf-integer). It tells the server that the request was most likely
// served before, here or by another instance behind the same load
// balancer, so that it can look up the stored response before it claims
// the key: idemhttp turns it into idem.WithRetryHint. A server that does
// not know the field ignores it; what the server answers never depends on
// it.
const HeaderAttempt = "Idempotency-Attempt"

// The defaults of [Transport]'s fields, used where a field is zero.
const (
	DefaultMaxAttempts   = 5                      // Transport.MaxAttempts
	DefaultMaxElapsed    = 30 * time.Second       // Transport.MaxElapsed
	DefaultBaseDelay     = 100 * time.Millisecond // Transport.BaseDelay
	DefaultMaxDelay      = 5 * time.Second        // Transport.MaxDelay
	DefaultMaxRetryAfter = 10 * time.Second       // Transport.MaxRetryAfter
	DefaultMaxBody       = 1 << 20                // Transport.MaxBody, in bytes
)

// Transport is an http.RoundTripper that adds an Idempotency-Key to unsafe
// requests and retries them with it; see the package documentation. The
// zero value is ready to use, with the defaults each field names. A
// Transport is safe for concurrent use; do not change its fields while it
// is in use.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport. Its
	// timeouts (ResponseHeaderTimeout, for one) bound a single attempt;
	// the request's context bounds them all.
	Base http.RoundTripper

	// MaxAttempts is the most attempts of one request, the first included.
	// Zero or less means DefaultMaxAttempts (5); 1 turns retries off.
	MaxAttempts int

	// MaxElapsed bounds the time from the start of the first attempt
	// within which a retry may start: a retry whose wait would end later,
	// or after the request context's deadline, is not made, and the last
	// answer or error is returned at once. It does not cut an attempt
	// short. Zero or less means DefaultMaxElapsed (30s).
	MaxElapsed time.Duration

	// BaseDelay and MaxDelay shape the backoff: the wait before retry n
	// (1, 2, ...) is drawn uniformly from [0, min(MaxDelay,
	// BaseDelay*2^(n-1))] ("full jitter"). An answer with Retry-After
	// replaces that draw. Zero or less means DefaultBaseDelay (100ms) and
	// DefaultMaxDelay (5s).
	BaseDelay, MaxDelay time.Duration

	// MaxRetryAfter caps the wait a server asks for with Retry-After
	// (delta-seconds or an HTTP-date). Zero or less means
	// DefaultMaxRetryAfter (10s).
	MaxRetryAfter time.Duration

	// MaxBody is the largest body, in bytes, that is held in memory to be
	// sent again when the request has no GetBody (http.NewRequest sets
	// GetBody for a *bytes.Buffer, *bytes.Reader or *strings.Reader body,
	// which is then never copied). A larger body is sent once, with its
	// key, and never retried. Zero or less means DefaultMaxBody (1 MiB).
	MaxBody int64

	// NoAutoKey turns key generation off: an unsafe request without an
	// Idempotency-Key is then sent once and never retried, as every
	// request without a key is.
	NoAutoKey bool
}

// RoundTrip implements http.RoundTripper. It does not modify req, and it
// closes req.Body.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	hasKey := len(req.Header.Values(HeaderIdempotencyKey)) > 0
	if !hasKey && (safe(req.Method) || t.NoAutoKey) {
		return base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	if !hasKey {
		if r.Header == nil {
			r.Header = make(http.Header)
		}
		r.Header.Set(HeaderIdempotencyKey, `"`+NewKey()+`"`)
	}
	replay, once, err := t.replayable(r)
	if err != nil {
		return nil, err
	}
	if once {
		return base.RoundTrip(r)
	}
	return t.retry(base, r, replay)
}

// replayable prepares r's body to be sent again: it returns the function
// that gives each retry its body, or once when the body is too large to
// hold and r must be sent once. r.Body is left ready for the first attempt.
func (t *Transport) replayable(r *http.Request) (replay func() (io.ReadCloser, error), once bool, err error) {
	switch {
	case r.Body == nil || r.Body == http.NoBody:
		body := r.Body
		return func() (io.ReadCloser, error) { return body, nil }, false, nil
	case r.GetBody != nil:
		return r.GetBody, false, nil
	}
	limit := positive(t.MaxBody, DefaultMaxBody)
	buf, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		r.Body.Close()
		return nil, false, fmt.Errorf("idemclient: read the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return nil, true, nil
	}
	if err := r.Body.Close(); err != nil {
		return nil, false, fmt.Errorf("idemclient: close the request body: %w", err)
	}
	replay = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	r.Body, _ = replay()
	r.GetBody = replay
	r.ContentLength = int64(len(buf))
	return replay, false, nil
}

// retry sends r through base until an answer is final or retries stop.
func (t *Transport) retry(base http.RoundTripper, r *http.Request, replay func() (io.ReadCloser, error)) (*http.Response, error) {
	ctx := r.Context()
	maxAttempts := positive(t.MaxAttempts, DefaultMaxAttempts)
	deadline := time.Now().Add(positive(t.MaxElapsed, DefaultMaxElapsed))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for attempt := 1; ; attempt++ {
		a := r
		if attempt > 1 {
			body, err := replay()
			if err != nil {
				return nil, fmt.Errorf("idemclient: get the body again: %w", err)
			}
			a = r.Clone(ctx)
			a.Body = body
			a.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
		}
		resp, err := base.RoundTrip(a)
		switch {
		case err != nil && (ctx.Err() != nil || !retryableError(err)):
			return nil, err
		case err == nil && resp.Request == nil:
			resp.Request = a
		}
		if err == nil && !retryableStatus(resp.StatusCode) {
			return resp, nil
		}
		wait := t.backoff(attempt)
		if resp != nil {
			if d, ok := retryAfter(resp.Header, time.Now()); ok {
				wait = min(d, positive(t.MaxRetryAfter, DefaultMaxRetryAfter))
			}
		}
		if attempt >= maxAttempts || time.Now().Add(wait).After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("idemclient: gave up after %d attempts: %w", attempt, err)
			}
			return resp, nil
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// backoff returns the wait before retry n (1, 2, ...): full jitter over
// min(MaxDelay, BaseDelay*2^(n-1)).
func (t *Transport) backoff(n int) time.Duration {
	ceiling := positive(t.MaxDelay, DefaultMaxDelay)
	d := positive(t.BaseDelay, DefaultBaseDelay)
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return mrand.N(min(d, ceiling) + 1)
}

// retryAfter parses the Retry-After field of h, delta-seconds or an
// HTTP-date, as a wait from now. A date in the past is no wait; a
// malformed field is as none.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// retryableStatus reports whether an answer may change on a retry with
// the same key: 409 (in flight), 429 and 5xx except 501.
func retryableStatus(code int) bool {
	return code == http.StatusConflict || code == http.StatusTooManyRequests ||
		code >= 500 && code <= 599 && code != http.StatusNotImplemented
}

// retryableError reports whether a failed attempt is worth another: any
// network error, but not a TLS handshake that failed for good (a
// certificate that does not verify, a server that does not speak TLS).
func retryableError(err error) bool {
	var cert *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	return !errors.As(err, &cert) && !errors.As(err, &record)
}

// safe reports whether method is safe in the sense of RFC 9110, section
// 9.2.1. The empty method is GET.
func safe(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func positive[T int | int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

type readCloser struct {
	io.Reader
	io.Closer
}

// NewKey returns a new random key, a version 4 UUID from crypto/rand such
// as 8e03978e-40d5-43e8-bc93-6894a57f9324. Set it yourself, as an
// sf-string, to know a request's key before it is sent:
//
//	req.Header.Set(idemclient.HeaderIdempotencyKey, strconv.Quote(idemclient.NewKey()))
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Key returns the idempotency key that resp's request was sent with: the
// content of an sf-string ("abc" gives abc), or the field's value as it
// is when it is not one (a bare token). It returns "" when resp, its
// Request or the field is absent.
func Key(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	v := strings.TrimSpace(resp.Request.Header.Get(HeaderIdempotencyKey))
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' && i+1 < len(v)-1 {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}
