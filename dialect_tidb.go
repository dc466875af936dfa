package idem

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemkit/idem/schema"
)

// TiDB is the dialect for TiDB (the MySQL protocol, through
// github.com/go-sql-driver/mysql) with its default transaction settings:
// pessimistic transactions that check a unique key in place
// (tidb_txn_mode = 'pessimistic', tidb_constraint_check_in_place_pessimistic
// = ON), under REPEATABLE READ or READ COMMITTED.
//
// The statements are MySQL's but for the read of an existing record,
// which is SELECT ... FOR UPDATE: TiDB refuses LOCK IN SHARE MODE (error
// 1235) unless told to treat it as a plain read, which would read the
// caller's REPEATABLE READ snapshot instead of the latest committed row. In
// a pessimistic transaction FOR UPDATE reads the latest committed version
// and locks the key, whether the row exists or not, until the transaction
// ends; so concurrent replays of one key take turns, each for the rest of
// its transaction.
//
// Before the claim, Do and Begin read the transaction's settings in one
// statement and refuse, before fn runs, what TiDB cannot make safe:
//
//   - an optimistic transaction (tidb_txn_mode 'optimistic' or empty when it
//     began, or BEGIN OPTIMISTIC): a duplicate key is found only at COMMIT,
//     so fn would run in every concurrent duplicate;
//   - tidb_constraint_check_in_place_pessimistic = OFF: the same, in a
//     pessimistic transaction (error 8147 at COMMIT);
//   - SERIALIZABLE, which TiDB refuses (error 8048) unless
//     tidb_skip_isolation_level_check is ON, and then runs as snapshot
//     isolation. A level set for one transaction (SET TRANSACTION, as
//     database/sql's BeginTx does) does not show in @@transaction_isolation
//     inside it, so idem refuses the session setting that lets SERIALIZABLE
//     through: tidb_skip_isolation_level_check = ON.
//
// The mode a transaction began in is not a variable: BEGIN OPTIMISTIC and
// BEGIN PESSIMISTIC override tidb_txn_mode for one transaction. idem reads
// it from information_schema.TIDB_TRX, whose ALL_SQL_DIGESTS lists the
// digests of the statements the transaction ran, the BEGIN first; when the
// first is neither BEGIN OPTIMISTIC nor BEGIN PESSIMISTIC, the transaction
// took tidb_txn_mode, as read now. Nothing cheaper tells: no variable or
// function holds the transaction's mode, and the statements behave alike
// until a duplicate meets them. TIDB_TRX lists the open transactions of
// the TiDB server the session is on (each session sees its own without the
// PROCESS privilege); reading it is most of the check's cost. Measured on
// a 2-core machine with one TiDB server: SELECT 1 took 0.14 ms, the
// variables alone 0.19 ms, the whole check 0.8 ms (0.93 ms with 100 other
// transactions open).
var TiDB Dialect = mustDialect(DialectSpec{
	Name:          "tidb",
	statements:    tidbDialect{}.statements,
	Inserted:      tidbDialect{}.inserted,
	Retryable:     tidbDialect{}.retryable,
	Applied:       tidbDialect{}.applied,
	Fix:           tidbDialect{}.fix,
	CheckSession:  tidbDialect{}.checkSession,
	SchemaFault:   tidbDialect{}.schemaFault,
	literals:      tidbDialect{}.literals,
	boundLockWait: tidbDialect{}.boundLockWait,
	// No CausalReads: every read sees what the database acknowledged.
})

type tidbDialect struct{ mysqlDialect }

func (tidbDialect) statements(parts []string) *statements {
	// FOR UPDATE is a current read in a pessimistic transaction: it sees
	// the latest committed row whatever the transaction's snapshot.
	st := myStatements(parts, schema.TiDB, myInsert, Returning{}, myForUpdate)
	st.NoReplicationWait = "TiDB commits through Raft to a majority of each region's TiKV replicas, so an acknowledged commit already survives the loss of a minority of them: there is nothing to wait for"
	// Its purge and strip wait for a held row: it has no SKIP LOCKED.
	st.purgeHeld, st.stripHeld = Statement{}, Statement{}
	// The purge's windows are read ahead over a span, and its batches
	// stop at their window's end (see purgeStart).
	legacy := args(ArgFrom, ArgRetention, ArgKeyMemory, ArgRetention)
	for _, b := range []struct {
		st *Statement
		to Statement
	}{
		{&st.purgeStart, Statement{tidbPurgeStart, args(ArgFrom)}},
		{&st.PurgeWindow, Statement{tidbPurgeWindow, args(ArgKeyMemory, ArgFrom, ArgUpto, ArgLimit)}},
		{&st.Purge, Statement{tidbPurge, args(ArgFrom, ArgTo, ArgKeyMemory)}},
		{&st.Strip, Statement{tidbStrip, args(ArgKeyMemory, ArgFrom, ArgTo, ArgKeyMemory)}},
		{&st.legacyStart, Statement{tidbLegacyStart, legacy}},
		{&st.LegacyWindow, Statement{tidbLegacyWindow, append(legacy, ArgUpto, ArgLimit)}},
		{&st.LegacyPurge, Statement{tidbLegacyPurge, append(legacy, ArgTo)}},
	} {
		*b.st = b.to
		b.st.SQL = render(b.st.SQL, st.Quoted, st.base())
	}
	return st
}

// TiDB's purge statements bound every scan at both ends. Its embedded
// storage (unistore) reads the whole key range of a coprocessor request,
// whatever the LIMIT pushed down with it: a window read from the cursor
// to now took 13 to 22 s at 5 M records with 4 M due, where the same read
// bounded to the 5,000 records it returns took 36 ms. So each window is
// read ahead over a span (ArgUpto: before it) and returns the database
// clock, and each batch's DELETE (or UPDATE) takes its window's records,
// from its first to its last (ArgTo), and no more: the next window starts
// past its last (purge.go), so that two batches at once never share a
// record. A window counts no live claim, which no batch takes. The first
// record due, where a sweep starts, is one read of the whole range, once
// a sweep. TiDB's own non-transactional DELETE (BATCH ON ... LIMIT)
// bounds its batches the same way.
const (
	// tidbDue is myDue of a record a batch may take: not a live claim.
	tidbDue = myDue + ` AND NOT ` + myLive

	tidbPurgeStart = `SELECT COALESCE(MIN(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at)), 0) FROM idempotency_keys
WHERE ` + tidbDue

	tidbPurgeWindow = `SELECT COUNT(*), COALESCE(MAX(expires_us), 0), COALESCE(SUM(kept), 0), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) FROM (
  SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) AS expires_us, ` + myKept + ` AS kept FROM idempotency_keys
  WHERE ` + tidbDue + ` AND expires_at < '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
  ORDER BY expires_at LIMIT ?) w`

	// tidbWindow is the records of a batch's window: tidbDue up to its
	// last expiry.
	tidbWindow = tidbDue + ` AND expires_at <= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND`

	// tidbPurge deletes the window's records but for those kept
	// (myKept), whole however long ago their forget time passed; tidbStrip
	// makes tombstones of those, whose expires_at is their forget time.
	tidbPurge = `DELETE FROM idempotency_keys WHERE ` + tidbWindow + ` AND NOT ` + myKept

	tidbStrip = `UPDATE idempotency_keys SET status = 'expired', response_headers = NULL, response_body = NULL, sealed_key = NULL,
  expires_at = ` + myForgetDue + `
WHERE ` + tidbWindow + ` AND ` + myKept

	tidbLegacyStart = `SELECT COALESCE(MIN(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)), 0) FROM idempotency_keys
WHERE ` + myLegacyWhere

	tidbLegacyWindow = `SELECT COUNT(*), COALESCE(MAX(created_us), 0), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) FROM (
  SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) AS created_us FROM idempotency_keys
  WHERE ` + myLegacyWhere + ` AND created_at < '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
  ORDER BY created_at LIMIT ?) w`

	tidbLegacyPurge = `DELETE FROM idempotency_keys WHERE ` + myLegacyWhere + `
  AND created_at <= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND`
)

// tidbSettings reads what checkSession decides on: the session's mode,
// its in-place check, its isolation level and isolation check, and the
// digest of the first statement of the open transaction.
const tidbSettings = `SELECT @@SESSION.tidb_txn_mode, @@SESSION.tidb_constraint_check_in_place_pessimistic,
  @@SESSION.transaction_isolation, @@SESSION.tidb_skip_isolation_level_check,
  COALESCE((SELECT JSON_UNQUOTE(JSON_EXTRACT(all_sql_digests, '$[0]')) FROM information_schema.tidb_trx
    WHERE id = @@tidb_current_ts AND session_id = CONNECTION_ID()), '')`

// The digests TiDB gives BEGIN OPTIMISTIC and BEGIN PESSIMISTIC: the
// SHA-256 of the normalized statement, as TIDB_ENCODE_SQL_DIGEST returns.
const (
	digestBeginOptimistic  = "f370ed6fc824014332f96cbf4c396ded79bbf2f9b30cd7f80e55e7ca34a4ae08" // begin optimistic
	digestBeginPessimistic = "307313c7c9681e7b8be9e83d48bb6ca0b821c207c7e7981b828d115515c911bc" // begin pessimistic
)

// checkSession refuses a transaction whose settings would let a duplicate
// through: see [TiDB]. Each error names the setting and how to change it.
func (tidbDialect) checkSession(ctx context.Context, c Conn) error {
	var (
		mode, isolation, first string
		inPlace, skipCheck     bool
	)
	if err := c.QueryRow(ctx, Query{SQL: tidbSettings}, &mode, &inPlace, &isolation, &skipCheck, &first); err != nil {
		return &Error{Op: "read the TiDB transaction's settings", Err: err, Hint: hintRollBack}
	}
	refuse := func(detail, hint string) error {
		return &Error{Op: "check the TiDB transaction's settings", Err: errUnsafeSession,
			Detail: "refused before running anything: " + detail, Hint: hint}
	}
	const optimistic = "an optimistic TiDB transaction finds a duplicate key only at COMMIT, so every concurrent duplicate would run"
	switch {
	case first == digestBeginOptimistic:
		return refuse("this transaction began with BEGIN OPTIMISTIC; "+optimistic,
			"roll back and begin it with BEGIN PESSIMISTIC, or with START TRANSACTION in a session whose tidb_txn_mode is 'pessimistic'")
	case first != digestBeginPessimistic && !strings.EqualFold(mode, "pessimistic"):
		return refuse(fmt.Sprintf("tidb_txn_mode is %q, so this transaction is optimistic; %s", mode, optimistic),
			"roll back, run SET SESSION tidb_txn_mode = 'pessimistic' (TiDB's default) and begin again, or begin with BEGIN PESSIMISTIC")
	case !inPlace:
		return refuse("tidb_constraint_check_in_place_pessimistic is OFF, so TiDB checks a duplicate key only at COMMIT (error 8147) and every concurrent duplicate would run",
			"run SET SESSION tidb_constraint_check_in_place_pessimistic = ON (TiDB's default), then roll back and run the transaction again")
	case strings.EqualFold(isolation, "SERIALIZABLE"):
		return refuse("transaction_isolation is SERIALIZABLE, which TiDB runs as snapshot isolation",
			"roll back, run SET SESSION transaction_isolation = 'REPEATABLE-READ' (or 'READ-COMMITTED') and begin again")
	case skipCheck:
		return refuse("tidb_skip_isolation_level_check is ON, which lets a transaction ask for SERIALIZABLE and get snapshot isolation, and a level set for one transaction cannot be read inside it",
			"roll back, run SET SESSION tidb_skip_isolation_level_check = OFF (TiDB's default: SERIALIZABLE is then refused with error 8048 when it is asked for) and begin again under REPEATABLE READ or READ COMMITTED")
	}
	return nil
}

// TiDB's error numbers idem reads, beside MySQL's deadlock and lock wait
// timeout. Each means the transaction was rolled back, or must be, and
// may be run again whole.
const (
	tidbForUpdateCantRetry   = 8002 // a conflict at COMMIT in a transaction that read FOR UPDATE
	tidbWriteConflictStale   = 8005 // write conflict: the transaction's start is stale
	tidbTxnRetryable         = 8022 // a KV error safe to retry
	tidbInfoSchemaChanged    = 8028 // a DDL changed a table during the transaction
	tidbLazyUniquenessFailed = 8147 // a duplicate found at COMMIT (lazy uniqueness check)
	tidbLockExpired          = 8229 // the pessimistic locks' TTL manager timed out
	tidbResolveLockTimeout   = 9004 // a lock of another transaction could not be resolved in time
	tidbWriteConflict        = 9007 // write conflict in the storage layer
)

func (tidbDialect) retryable(err error) bool {
	n, ok := mysqlErrno(err)
	if !ok {
		return false
	}
	switch n {
	case erLockWaitTimeout, erLockDeadlock, erLockNowait,
		tidbForUpdateCantRetry, tidbWriteConflictStale, tidbTxnRetryable, tidbInfoSchemaChanged,
		tidbLazyUniquenessFailed, tidbLockExpired, tidbResolveLockTimeout, tidbWriteConflict:
		return true
	}
	return false
}
