// Package idemgin puts idemhttp's middleware in a gin chain. gin wraps
// handlers, not http.Handler middleware, so [Middleware] runs the rest of
// the chain (the handler and every middleware after it) inside idemhttp:
// it swaps the gin.Context's Writer for one that the middleware captures
// and its Request for the middleware's, whose context carries the
// transaction, and puts both back before the middlewares ahead of it go
// on. The answer goes out through gin once it is committed:
//
//	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db, Scope: accountOf, Required: true})
//	...
//	r := gin.New()
//	r.Use(gin.Logger(), gin.Recovery(), auth) // ahead of idem: they see the final answer
//	r.POST("/v1/charges", idemgin.Middleware(mw), func(c *gin.Context) {
//		tx := idemgin.TxFrom(c)
//		...
//		c.JSON(http.StatusCreated, charge)
//	})
//
// The handler's transaction is in the context of c.Request, which the
// middleware swapped in: [TxFrom](c) reads it there, as
// idemhttp.TxFrom(c.Request.Context()) does. idemhttp.TxFrom(c), passed
// the gin.Context itself, returns nil unless the engine sets
// ContextWithFallback (gin's Context looks values up in its request's
// context only then); so does idemhttp.ClaimFrom(c), whose claim is
// idemhttp.ClaimFrom(c.Request.Context()). On pgx, build mw with
// Config.Runner set to idempgx.New(pool, opts) and take the pgx.Tx from
// idempgx.TxFrom(c.Request.Context()).
//
// What the chain after it writes (c.JSON, c.String, c.Status,
// c.AbortWithStatusJSON, ...) is the answer that is stored and replayed;
// when the middleware answers itself (a replay, a 409, a 422), the rest of
// the chain does not run and c.IsAborted reports true. A handler that
// records an error with c.Error and writes nothing is answered with the
// middleware's 500 (mw.Fail: the error goes to idemhttp's Config.Logger,
// an *idemhttp.Problem is answered as itself) and rolled back, so that an
// empty 200 is never stored: put a middleware that answers from c.Errors
// after this one, not ahead of it. A handler's panic
// rolls back and reaches gin.Recovery ahead of the middleware.
//
// gin runs a chain once per request: it cannot start it again. When
// idemhttp's ModeTransaction would run the handler a second time (the
// database aborted the middleware's statements or the commit with a
// serialization failure or a deadlock, see docs/http.md), the request is
// rolled back and answered 503 (idemhttp.TypeContention, Retry-After: 1)
// instead, nothing stored, and the client's retry runs it. ModeClaim
// never runs a handler twice.
package idemgin
