package idemgin

import (
	"bufio"
	"database/sql"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/idemhttp"
)

// Middleware returns gin middleware that serves the rest of the chain
// behind mw, as the package documentation describes.
func Middleware(mw *idemhttp.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !mw.Handles(c.Request) { // a method the middleware passes through, untouched
			c.Next()
			return
		}
		ran := false
		mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ran {
				rerun(w, r)
				return
			}
			ran = true
			serve(mw, c, w, r)
		})).ServeHTTP(c.Writer, c.Request)
		if !ran {
			c.Abort() // the middleware answered: a replay, a problem
		}
	}
}

// TxFrom returns the transaction of the request c serves, behind the
// middleware: idemhttp.TxFrom of c.Request's context. idemhttp.TxFrom(c)
// finds nothing unless the engine sets ContextWithFallback, since gin's
// Context reads the request's context only then.
func TxFrom(c *gin.Context) *sql.Tx { return idemhttp.TxFrom(c.Request.Context()) }

// serve runs the rest of c's chain with w, the middleware's capture, as
// its Writer and r, the middleware's request, as its Request, and puts
// c's own back when it returns or panics. When the chain wrote nothing and
// reported errors with c.Error, the answer is mw's 500 for them, which
// logs them to its Config.Logger.
func serve(mw *idemhttp.Middleware, c *gin.Context, w http.ResponseWriter, r *http.Request) {
	writer, request := c.Writer, c.Request
	defer func() { c.Writer, c.Request = writer, request }()
	rw := &responseWriter{ResponseWriter: w, size: unwritten, status: http.StatusOK}
	c.Writer, c.Request = rw, r
	before := len(c.Errors)
	c.Next()
	if !rw.Written() && len(c.Errors) > before {
		errs := make([]error, 0, len(c.Errors)-before)
		for _, e := range c.Errors[before:] {
			errs = append(errs, e)
		}
		mw.Fail(rw, r, errors.Join(errs...))
		return
	}
	rw.WriteHeaderNow() // a status set with c.Status and no body, as gin writes it after the chain
}

// rerun answers a second run of the handler, which gin cannot do: a 5xx,
// so that the attempt is rolled back and nothing is stored.
func rerun(w http.ResponseWriter, r *http.Request) {
	(&idemhttp.Problem{Type: idemhttp.TypeContention, Title: "Database contention", Status: http.StatusServiceUnavailable, RetryAfter: time.Second,
		Detail: "the database aborted the transaction (a serialization failure or a deadlock) after the handler ran, and it cannot run again within this request; nothing was stored; retry with the same " + idemhttp.HeaderIdempotencyKey}).ServeHTTP(w, r)
}

// unwritten is the size of a response whose header is not written yet.
const unwritten = -1

// responseWriter is gin's ResponseWriter over the middleware's capture of
// the response, with gin's own semantics: the status is written with the
// first byte of the body, or by WriteHeaderNow.
type responseWriter struct {
	http.ResponseWriter
	size   int
	status int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && w.status != code && !w.Written() {
		w.status = code
	}
}

func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(data []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(data)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *responseWriter) Status() int   { return w.status }
func (w *responseWriter) Size() int     { return w.size }
func (w *responseWriter) Written() bool { return w.size != unwritten }

// Flush and FlushError reach the capture, which refuses them:
// idemhttp.ErrStreaming.
func (w *responseWriter) Flush() { _ = w.FlushError() }

func (w *responseWriter) FlushError() error {
	w.WriteHeaderNow()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack reaches the capture, which refuses it: idemhttp.ErrStreaming.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify returns a channel that never fires: behind the middleware
// the work goes on when the client goes, so that its answer is stored for
// the client's retry.
func (w *responseWriter) CloseNotify() <-chan bool { return make(chan bool) }

// Pusher returns nil: nothing is sent before the commit.
func (w *responseWriter) Pusher() http.Pusher { return nil }

// Unwrap returns the capture, for http.ResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
