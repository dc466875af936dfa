// Package idemchi holds no code: chi takes net/http middleware as it is,
// so idemhttp's middleware needs no adapter there. This module holds the
// tests and the example that show it, with chi's own middleware ahead of
// it and URL parameters read behind it, and keeps chi out of the root
// module's dependencies:
//
//	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db, Scope: accountOf, Required: true})
//	...
//	r := chi.NewRouter()
//	r.Use(middleware.Logger, middleware.Recoverer, auth) // ahead of idem: they see the final answer
//	r.With(mw.Handler).Post("/v1/charges", createCharge) // or r.Use(mw.Handler) in a r.Group
//
//	func createCharge(w http.ResponseWriter, r *http.Request) {
//		tx := idemhttp.TxFrom(r.Context()) // write your rows here; never Commit or Rollback it
//		...
//	}
//
// On pgx, build mw with Config.Runner set to idempgx.New(pool, opts) and
// take the pgx.Tx from idempgx.TxFrom(r.Context()). chi.URLParam works behind the middleware:
// the request's context keeps chi's route context.
package idemchi
