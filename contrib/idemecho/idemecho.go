package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/idemhttp"
)

// Middleware returns echo middleware that serves the rest of the chain
// behind mw, as the package documentation describes.
func Middleware(mw *idemhttp.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req, res := c.Request(), c.Response()
			defer func() {
				c.SetRequest(req)
				c.SetResponse(res)
			}()
			var passed error
			mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r == req { // a method the middleware passes through, untouched
					passed = next(c)
					return
				}
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				err := next(c)
				if err == nil {
					return
				}
				c.Error(err) // the error handler answers into the capture, to be stored or rolled back
				if !c.Response().Committed {
					(&idemhttp.Problem{Type: idemhttp.TypeInternal, Title: "Internal error", Status: http.StatusInternalServerError,
						Detail: "the request failed on the server and was rolled back; nothing was stored; retry with the same " + idemhttp.HeaderIdempotencyKey}).ServeHTTP(c.Response(), r)
				}
			})).ServeHTTP(res, req)
			return passed
		}
	}
}
