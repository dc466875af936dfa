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
			if !mw.Handles(req) { // a method the middleware passes through, untouched
				return next(c)
			}
			defer func() {
				c.SetRequest(req)
				c.SetResponse(res)
			}()
			mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				err := next(c)
				if err == nil {
					return
				}
				c.Error(err) // the error handler answers into the capture, to be stored or rolled back
				if !c.Response().Committed {
					mw.Fail(c.Response(), r, err)
				}
			})).ServeHTTP(res, req)
			return nil
		}
	}
}
