package idem

import (
	"fmt"
	"strings"
)

// Galera (MariaDB Galera Cluster, multi-primary) runs the MySQL family's
// statements on every node, and commits a transaction on all of them
// once it passes certification at COMMIT. Two things differ from one
// InnoDB server, and both would let a duplicate through:
//
//   - A row lock is a lock on one node only. A duplicate on another node
//     does not wait for the claim: both run fn, and certification rolls
//     back all but one at COMMIT (measured: fn ran 175 and 182 times for
//     60 keys of 8 duplicates each over three nodes).
//   - A node applies the commits of the others a little later than they
//     were acknowledged (wsrep_sync_wait = 0, the servers' default): a
//     Claim's Complete on a node that has not applied the claim yet
//     changes nothing and finds no record.
//
// So, by the rule of docs/dialects.md (a mode in which a duplicate would
// not wait for the claim is refused before fn, naming the setting), Do
// and Apply refuse a transaction on a Galera node unless it streams its
// statements (Galera 4's streaming replication, wsrep_trx_fragment_size
// above 0): each statement, the claim included, is then certified and
// replicated, its rows locked on every node, before the next runs, so a
// duplicate on another node waits for the claim as on one server, or is
// aborted (error 1213, retryable) before its fn. The check costs no
// statement: the claim's status is an expression that fails (error 1242,
// read as the refusal) on a Galera node whose session does not stream
// (galeraGuard). Begin, which commits its claim alone, needs no
// streaming, but causal reads (causalReads). Streaming the claim alone,
// for that one statement (SET STATEMENT wsrep_trx_fragment_size = 1
// FOR ...), was tried and measured: it made Do correct, and KILL of
// sessions with such a claim in flight, beside duplicates on the other
// nodes, hung the whole cluster twice in two runs of the fault history
// (MariaDB 10.11.19, galera 26.4.23), where without streaming 131 kills
// in 3 s hung nothing. idem does not turn it on for you.
//
// The statements that decide also carry wsrep_sync_wait = 15 for
// themselves (SET STATEMENT ... FOR, which leaves the session's own
// value as it was and adds no round trip): a statement outside a
// transaction, or the first of one, then waits until its node has
// applied what the cluster committed before it (Extend and Release on a
// pool). Inside a transaction it does not: there the session's own
// causal reads decide (causalReads).
//
// The MySQL dialect sends the same in MariaDB's executable comments
// (/*M! ... */), which MySQL reads as comments: idem.MySQL is as safe on
// MariaDB Galera as idem.MariaDB, and unchanged on MySQL. TiDB gets
// neither. Both need a MariaDB built with wsrep, as MariaDB's own
// packages and Debian's are (the variables exist, and do nothing, while
// wsrep_on is OFF).
const galeraCausal = `SET STATEMENT wsrep_sync_wait = 15 FOR `

// galeraGuard is status, the literal status of a claim of Do's or
// Apply's, as an expression that fails with error 1242 (a subquery of
// two rows) on a Galera node whose session does not stream its
// statements, and is status everywhere else.
func galeraGuard(status string) string {
	return `/*M! IF(@@wsrep_on AND @@wsrep_trx_fragment_size = 0, (SELECT 'refused' UNION ALL SELECT 'refused'), */ ` + status + ` /*M! ) */`
}

// galeraCausalGuard is status, the literal status of a claim of
// Begin's, as an expression that fails with error 1139 (a pattern that
// does not compile) on a Galera node whose session lacks causal reads at
// the start of its transactions (causalReads says why Begin needs them),
// and is status everywhere else: the check costs Begin no statement of
// its own.
func galeraCausalGuard(status string) string {
	return `/*M! IF('a' REGEXP IF(@@wsrep_on AND (@@wsrep_sync_wait & 1) = 0, '(', ''), */ ` + status + ` /*M! , NULL) */`
}

// galera returns st with the claims of Do and Apply guarded
// (galeraGuard), Begin's by galeraCausalGuard, and every other statement
// that decides prefixed by causal. Begin's claim takes no prefix: the
// prefix would set the very variable its guard reads, and the session's
// own causal reads, which the guard requires, already made its
// transaction begin once its node caught up. The prefixed statements are
// the statements of Do, Apply and Begin, and of a Claim's Complete,
// Extend and Release. The purge, the inspection and the migrations are
// left as they are: they decide nothing about a key that a later
// statement does not fence.
func galera(st *statements, causal string) *statements {
	st.InsertOwn.SQL = strings.Replace(st.InsertOwn.SQL, `'processing'`, galeraGuard(`'processing'`), 1)
	st.InsertDone.SQL = strings.Replace(st.InsertDone.SQL, `'completed'`, galeraGuard(`'completed'`), 1)
	st.Insert.SQL = strings.Replace(st.Insert.SQL, `'processing'`, galeraCausalGuard(`'processing'`), 1)
	for _, s := range []*Statement{&st.InsertOwn, &st.InsertDone, &st.Takeover, &st.Claimed, &st.Read,
		&st.ReadCompleted, &st.State, &st.Complete, &st.Extend, &st.Release, &st.Remove} {
		s.SQL = causal + s.SQL
	}
	return st
}

// erSubqueryRows is error 1242, "Subquery returns more than 1 row": from
// a claim of Do's or Apply's, galeraGuard's refusal.
const erSubqueryRows = 1242

// erRegexp is error 1139, a pattern that does not compile: from a claim
// of Begin's, galeraCausalGuard's refusal.
const erRegexp = 1139

// errGaleraCausal is the Err of the refusal of a session on a Galera node
// without causal reads, where a Claim needs them.
var errGaleraCausal = fmt.Errorf("%w: this session is on a Galera node (wsrep_on) without causal reads (wsrep_sync_wait lacks 1): a transaction may begin before its node has applied "+
	"what other nodes committed, so a claim completed on another node than its Begin's could miss its own claim, and idem could not tell it from a lost one", errUnsafeSession)

// galeraCausalFix is what to do about errGaleraCausal.
const galeraCausalFix = "add wsrep_sync_wait=1 to the DSN (go-sql-driver/mysql sets it on every connection: ?wsrep_sync_wait=1), or set it on the servers, then run the transaction again"

// errGaleraTxMode is the Err of the refusal of Do and Apply on a Galera
// node whose session does not stream its statements.
var errGaleraTxMode = fmt.Errorf("%w: on a Galera node without streaming replication (wsrep_trx_fragment_size = 0), a duplicate on another node would not wait for the claim, and fn would run on each node", errUnsafeSession)

// galeraTxModeFix is what to do about errGaleraTxMode.
const galeraTxModeFix = "use claim mode (Begin, the operation, then Complete in the transaction of its rows), which is correct on a multi-primary cluster; " +
	"or stream the session's transactions (wsrep_trx_fragment_size=1 in the DSN), knowing that KILL of such sessions beside duplicates hung a test cluster (docs/replication.md)"

// galeraCausalOff reads whether the session is on a Galera node
// (wsrep_on) without causal reads at the start of a transaction
// (wsrep_sync_wait lacks its bit 1: BEGIN, and reads). On MySQL, which
// has neither variable, it reads FALSE.
const galeraCausalOff = `SELECT /*M! @@wsrep_on AND (@@wsrep_sync_wait & 1) = 0 OR */ FALSE`

// wsrepNotReady is MariaDB Galera's error 1047 (ER_UNKNOWN_COM_ERROR),
// "WSREP has not yet prepared node for application use": the node is not
// in the cluster's primary component, or not synced with it. It refused
// the statement; nothing ran.
const wsrepNotReady = 1047

// galeraFix is the hint for error 1047: where to run the transaction
// again.
const galeraFix = "this Galera node is not ready (error 1047: it is not in the primary component or not synced): it refused the statement and nothing ran; " +
	"run the whole transaction again on a connection to another node (idem.RunTx and idem.Retry do so on a new connection of the pool: give the pool " +
	"more than one node, or put a proxy in front that sends connections only to nodes whose wsrep_ready is ON)"
