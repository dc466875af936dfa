// Package idemecho puts idemhttp's middleware in an echo chain.
//
// echo.WrapMiddleware(mw.Handler) is not enough: an echo handler answers
// an error by returning it, and echo's HTTPErrorHandler writes the answer
// only after the middleware has returned, so idemhttp would have stored
// and committed an empty 200 in its place, with the handler's rows.
// [Middleware] runs the rest of the chain (the handler and every
// middleware after it) inside idemhttp, on a Response over the
// middleware's capture and the middleware's request, whose context
// carries the transaction, and hands an error the chain returns to the
// HTTPErrorHandler there, so that its answer is the one stored: an
// echo.HTTPError's 4xx is stored and replayed, any other error is the
// error handler's 500, which rolls back; an error the error handler
// answers nothing for is the middleware's 500 (mw.Fail: logged to
// idemhttp's Config.Logger), which rolls back too. A request the
// middleware passes through (mw.Handles is false) runs the chain as it
// is. The request and the Response of the middlewares ahead are put back
// before they go on, and they see the answer that went out:
//
//	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db, Scope: accountOf, Required: true})
//	...
//	e := echo.New()
//	e.Use(middleware.Logger(), middleware.Recover(), auth) // ahead of idem
//	e.POST("/v1/charges", func(c echo.Context) error {
//		ctx := c.Request().Context()
//		tx := idemhttp.TxFrom(ctx)
//		...
//		return c.JSON(http.StatusCreated, charge)
//	}, idemecho.Middleware(mw))
//
// On pgx, build mw with Config.Runner set to idempgx.New(pool, opts) and
// take the pgx.Tx from idempgx.TxFrom(c.Request().Context()).
//
// When the middleware answers itself (a replay, a 409, a 422), the rest of
// the chain does not run. When idemhttp's ModeTransaction runs the
// handler again after the database aborted its transaction, the chain
// runs again, as net/http's would. A handler's panic rolls back and
// reaches the Recover middleware ahead.
package idemecho
