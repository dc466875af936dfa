// Package idemgorm runs idem inside GORM's transactions.
//
// In a GORM service, idem's record goes through the same transaction as
// the rows GORM writes: inside db.Transaction, hand [idem.Store.Do] the
// transaction's connection, tx.Statement.ConnPool (a *sql.Tx, or with
// PrepareStmt a *gorm.PreparedStmtTX), and wrap the whole transaction in
// [idem.Retry], so that a duplicate the database aborted (a serialization
// failure, a deadlock) runs again and replays:
//
//	err := idem.Retry(ctx, func() error {
//		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
//			res, err = store.Do(ctx, tx.Statement.ConnPool, req, func(ctx context.Context) (idem.Response, error) {
//				if err := tx.Create(&charge).Error; err != nil {
//					return idem.Response{}, err
//				}
//				return idem.Response{StatusCode: 201, Body: body}, nil
//			})
//			return err
//		})
//	})
//
// Outside a transaction, db.Statement.ConnPool is the pool (a *sql.DB, or
// with PrepareStmt a *gorm.PreparedStmtDB): Do and [idem.Claim.Complete]
// refuse it before any statement, since each statement through it would
// commit on its own, apart from the business rows.
//
// A handler behind idemhttp's middleware (or idemgrpc's interceptor), where
// the middleware runs Do and owns the transaction, writes through the
// *gorm.DB that [WithTx] binds to it:
//
//	tx := idemgorm.WithTx(r.Context(), db, idemhttp.TxFrom(r.Context()))
//	if err := tx.Create(&charge).Error; err != nil { ... }
//
// docs/orm.md shows the same for the other ORMs and query builders.
package idemgorm
