package idemhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
)

// ErrStreaming is what Flush (through [http.ResponseController]) and Hijack
// return to a handler behind the middleware. Its response is buffered
// until the transaction commits, so it cannot be streamed; the request is
// rolled back and answered with a 500 [Problem] of type [TypeStreaming].
var ErrStreaming = errors.New("idemhttp: the response is buffered until the transaction commits; Flush and Hijack are not supported behind this middleware")

// recorder captures a handler's response. It implements http.Flusher and
// http.Hijacker only to refuse them loudly (see ErrStreaming), and has no
// Unwrap method, so http.ResponseController cannot reach the connection
// around it.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	streamed string // "Flush" or "Hijack" once the handler tried to stream
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the first final status. Informational responses
// (1xx) cannot be sent before the commit and are dropped.
func (r *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if r.status == 0 && code >= 200 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if !bodyAllowed(r.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if _, ok := r.header["Content-Type"]; !ok && r.body.Len() == 0 && len(b) > 0 {
		// Sniff as net/http would, so that the stored header has it.
		r.header.Set("Content-Type", http.DetectContentType(b))
	}
	return r.body.Write(b)
}

// Flush marks the response as streamed: see [ErrStreaming].
func (r *recorder) Flush() { _ = r.FlushError() }

// FlushError is what http.ResponseController.Flush calls: it returns
// [ErrStreaming].
func (r *recorder) FlushError() error {
	if r.streamed == "" {
		r.streamed = "Flush"
	}
	return ErrStreaming
}

// Hijack returns [ErrStreaming].
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if r.streamed == "" {
		r.streamed = "Hijack"
	}
	return nil, nil, ErrStreaming
}

// statusCode is the recorded status: 200 when the handler set none.
func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// writeResponse writes a response to w, its header fields added to those
// already set on w.
func writeResponse(w http.ResponseWriter, h http.Header, status int, body []byte) {
	dst := w.Header()
	for name, values := range h {
		dst[name] = values
	}
	w.WriteHeader(status)
	if len(body) > 0 {
		_, _ = w.Write(body)
	}
}
