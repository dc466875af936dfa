package idemgorm

import (
	"context"
	"database/sql"
	"errors"

	"gorm.io/gorm"
)

// errNoTx is what a *gorm.DB that WithTx bound to no transaction fails
// every statement with.
var errNoTx = errors.New("idemgorm: WithTx got a nil *sql.Tx, so there is no transaction to write through: " +
	"idemhttp.TxFrom (and idemgrpc.TxFrom) return nil outside their middleware, for a method it passes through, " +
	"and in ModeClaim when the transaction could not begin; call WithTx in a handler behind the middleware; " +
	"under gin, the context to read the transaction from is c.Request.Context(), or take it with idemgin.TxFrom(c): " +
	"idemhttp.TxFrom(c) of the *gin.Context itself returns nil")

// WithTx returns db bound to tx, a transaction that idem's middleware
// (idemhttp.TxFrom, idemgrpc.TxFrom) or the caller's own idem.RunTx
// began: every statement through it runs in tx, with ctx, as inside
// db.Transaction. With PrepareStmt, its statements are prepared and
// cached as db.Transaction's are. The caller must not commit or roll
// back tx through it: whoever began tx ends it. A db.Transaction called
// on it nests in tx, as a savepoint.
//
// When tx is nil, every statement through the returned *gorm.DB fails
// with an error that says so, and nothing is written.
func WithTx(ctx context.Context, db *gorm.DB, tx *sql.Tx) *gorm.DB {
	bound := db.Session(&gorm.Session{NewDB: true, Context: ctx})
	if tx == nil {
		_ = bound.AddError(errNoTx)
		return bound
	}
	var pool gorm.ConnPool = tx
	if prepared, ok := db.ConnPool.(*gorm.PreparedStmtDB); ok {
		pool = &gorm.PreparedStmtTX{Tx: tx, PreparedStmtDB: prepared}
	}
	bound.Statement.ConnPool = pool
	return bound
}
