package idem

import "context"

// Galera (MariaDB Galera Cluster, multi-primary) runs the MySQL family's
// statements on every node, and commits a transaction on all of them
// once it passes certification at COMMIT. Two things differ from one
// InnoDB server, and both would let a duplicate through:
//
//   - A node applies the commits of the others a little later than they
//     were acknowledged (wsrep_sync_wait = 0, the servers' default). A
//     request on node B right after the key committed on node A may find
//     no record and run again (it then loses at certification, but its fn
//     has run), and a Claim's Complete on a node that has not applied the
//     claim yet changes nothing and finds no record.
//   - A row lock is a lock on one node only. A duplicate on another node
//     does not wait for the claim: both run fn, and certification rolls
//     back all but one at COMMIT.
//
// So on MariaDB the statements that decide run with causal reads, and the
// claim of Do and Apply (a new record, or a takeover) is replicated as a
// fragment of its own (Galera 4's streaming replication) before fn runs:
// it is certified, and its row locked, on every node, so a duplicate on
// another node waits for it as on one server, or, when its own claim came
// first on its node, is aborted (error 1213, retryable) before its fn. Each
// statement sets the variables for itself only (SET STATEMENT ... FOR),
// which leaves the session's own as they were and adds no round trip:
//
//   - wsrep_sync_wait = 15: the statement first waits until its node has
//     applied every transaction the cluster committed before it began
//     (reads, UPDATE and DELETE, INSERT). Without Galera it does nothing.
//   - wsrep_trx_fragment_size = 1 (bytes, the default unit), for the claim
//     only, where wsrep_on is ON: the claim is replicated as a fragment
//     when its statement ends. The rest of the transaction replicates at
//     COMMIT, as usual.
//
// The MySQL dialect sends the same settings in MariaDB's executable
// comment (/*M! ... */), which MySQL reads as a comment: idem.MySQL is
// as safe on MariaDB Galera as idem.MariaDB, and unchanged on MySQL. TiDB
// has no such variables and gets neither. Both settings need a MariaDB
// server built with wsrep, as MariaDB's own packages and Debian's are
// (the variables exist, and do nothing, while wsrep_on is OFF).
const (
	// galeraCausal makes one statement wait until its node has applied
	// what the cluster committed before it.
	galeraCausal = `SET STATEMENT wsrep_sync_wait = 15 FOR `
	// galeraClaim is galeraCausal, and replicates the claim as a fragment
	// of its own on a node of a Galera cluster.
	galeraClaim = `SET STATEMENT wsrep_sync_wait = 15, wsrep_trx_fragment_size = IF(@@wsrep_on, 1, 0) FOR `
)

// galera returns st with its claims prefixed by claim and the reads and
// fenced statements that decide by causal: the statements of Do, Apply
// and Begin, and of a Claim's Complete, Extend and Release. Begin's own
// insert, committed alone at once, is causal only: a duplicate on another
// node loses at certification, before anything of the caller's ran. The
// purge, the inspection and the migrations are left as they are: they
// decide nothing about a key that a later statement does not fence.
func galera(st *statements, causal, claim string) *statements {
	for _, s := range []*statement{&st.insertOwn, &st.insertDone, &st.takeover} {
		s.sql = claim + s.sql
	}
	for _, s := range []*statement{&st.insert, &st.claimed, &st.read, &st.readCompleted, &st.state,
		&st.complete, &st.extend, &st.release, &st.remove} {
		s.sql = causal + s.sql
	}
	return st
}

// galeraCausalOff reads whether the session is on a Galera node
// (wsrep_on) without causal reads at the start of a transaction
// (wsrep_sync_wait lacks its bit 1: BEGIN, and reads). On MySQL, which
// has neither variable, it reads FALSE.
const galeraCausalOff = `SELECT /*M! @@wsrep_on AND (@@wsrep_sync_wait & 1) = 0 OR */ FALSE`

// causalReads refuses a session on a Galera node whose transactions do
// not wait, at their start, for the node to apply what the cluster
// committed before. A causal wait set for one statement (galeraCausal)
// holds for a statement outside a transaction, and for the first of
// one, only: inside a transaction, measured on MariaDB 10.11 and galera
// 26.4.23, an UPDATE of a row committed on another node a moment before
// missed it (or was aborted) 64 times in 300 with it, 14 without. So a
// Claim's Complete, in the caller's transaction on another node than its
// Begin's, needs the session's own causal reads: its transaction then
// begins once its node has applied the claim.
func (mysqlDialect) causalReads(ctx context.Context, c conn) error {
	var off bool
	if err := c.queryRow(ctx, Query{SQL: galeraCausalOff}, &off); err != nil {
		return &Error{Op: "read the Galera session's settings", Err: err, Hint: hintRollBack}
	}
	if !off {
		return nil
	}
	return &Error{Op: "check the Galera session's settings", Err: errUnsafeSession,
		Detail: "this session is on a Galera node (wsrep_on) without causal reads (wsrep_sync_wait lacks 1): a transaction may begin before its node has applied " +
			"what other nodes committed, so a Claim completed on another node than its Begin's could miss its own claim, and idem could not tell it from a lost one",
		Hint: "add wsrep_sync_wait=1 to the DSN (go-sql-driver/mysql sets it on every connection: ?wsrep_sync_wait=1), or set it on the servers, then run the transaction again"}
}

// wsrepNotReady is MariaDB Galera's error 1047 (ER_UNKNOWN_COM_ERROR),
// "WSREP has not yet prepared node for application use": the node is not
// in the cluster's primary component, or not synced with it. It refused
// the statement; nothing ran.
const wsrepNotReady = 1047

// galeraFix is the hint for error 1047: where to run the transaction
// again.
const galeraFix = "this Galera node is not ready (error 1047: it is not in the primary component or not synced): it refused the statement and nothing ran; " +
	"run the whole transaction again on a connection to another node (RunTx and Retry do so on a new connection of the pool: give the pool " +
	"more than one node, or put a proxy in front that sends connections only to nodes whose wsrep_ready is ON)"
