// Package idemtest holds the checks that every stack a Go service keeps
// its transactions in must pass with idem, written once and run on real
// database servers: by the tests of idem's integrations under contrib/
// (GORM, bun, ent, chi, echo, gin), by idem's own (sqlc, net/http's
// ServeMux), and by the tests of an ORM or router of anyone else's. They
// check a stack around idem's Store; idem's own behaviour on a driver or
// a database is the conformance suite's, module idemtest/conformance,
// whose Exercise a driver's adapter or a dialect runs, as river's
// riverdrivertest is for river's drivers. The servers come from package
// [github.com/idemkit/idem/idemtest/testdb].
//
// An ORM or query builder is a [Stack]: a function that charges one
// request as its users would write it (idem's Do inside the stack's own
// transaction, retried with idem.Retry or a RunTx), and one that counts
// the business rows. [RunStack] runs the storm, rollback, replay and
// mismatch checks on it, each as a subtest. A stack's test makes a
// database of its own on each server ([PostgresDatabase],
// [MariaDBDatabase]), opens its pool there, and passes the two functions:
//
//	func TestStack(t *testing.T) {
//		d := idemtest.PostgresDatabase(t) // skipped when there is no server
//		db := open(t, d.DSN)             // the stack's own pool, its tables created
//		store, _ := idem.New(d.Dialect)
//		_ = store.Migrate(t.Context(), db.SQL())
//		idemtest.RunStack(t, idemtest.Stack{
//			Name: "myorm", Store: store, DB: db.SQL(),
//			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
//				var res idem.Result
//				err := idem.Retry(ctx, func() error {
//					return db.InTx(ctx, iso, func(tx *myorm.Tx) error {
//						var err error
//						res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
//							id, err := tx.Insert(ctx, &Charge{Ref: req.Key})
//							if err != nil {
//								return idem.Response{}, err
//							}
//							if err := then(); err != nil {
//								return idem.Response{}, err
//							}
//							return idem.Response{StatusCode: 201, Body: idemtest.ChargeBody(id)}, nil
//						})
//						return err
//					})
//				})
//				return res, err
//			},
//			Rows: func(ctx context.Context, key string) (int, error) { return db.CountCharges(ctx, key) },
//		})
//	}
//
// A request ([ChargeRequest]) has a key of its own, so the checks may run
// again on the same tables.
//
// An HTTP router is checked through idemhttp's middleware: [RunHTTP]
// builds a payments service for it (a [PaymentsApp]: a charges table, a
// Store and the middleware, on PostgreSQL and MariaDB, in both of
// idemhttp's modes), and the router's test returns the router that serves
// the app's handler, written in the router's idiom, behind
// app.Middleware; [RunHTTPRetry] makes the middleware run that handler
// twice within one request. A router's own tests beside them have a
// [RouterEnv] and [Post].
//
// [Records] fills idem's table with many records in one statement, for a
// test of what a big table does, and [Numbers] counts in SQL on the
// MySQL family.
package idemtest
