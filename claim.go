package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Claim is the right to run one operation, committed by Begin as a
// PROCESSING record with a lease. Its methods are fenced on its token: once
// another request has taken the key over (after the lease ran out, or after
// Release), or the claim has been completed, they change nothing and return
// an error wrapping [ErrLeaseLost]. A Claim's fields do not change, so its
// methods may be called from several goroutines (a heartbeat calling Extend
// beside the work that ends in Complete).
type Claim struct {
	s     *Store
	req   Request
	token int64
}

// Begin claims req for work that must not hold a transaction open, such as
// a call to a payment provider. It commits a PROCESSING record with a lease
// of the [Store]'s [WithLease] (default 30s) in a short transaction of its own
// on db, with the same claiming rules as Do, and returns exactly one of:
//
//   - claim: the caller runs the operation, then calls Complete in the
//     transaction that writes its business rows, or Release to give up;
//   - replay: an earlier execution completed; its Response, with Replayed
//     true;
//   - err: ErrInvalidKey or ErrInvalidRequest (before any statement),
//     ErrMismatch, an *InFlightError whose RetryAfter is the remaining lease
//     of the live claim that holds the key, or a database error.
//
// A claim whose lease ran out, or that was released, is taken over by the
// next Begin or Do, with a larger token. Begin retries its own transaction
// on the errors [IsRetryable] reports, as [RunTx] does. On a Galera node
// it refuses a session without causal reads (wsrep_sync_wait=1 in the
// DSN), where a Complete on another node could miss the claim: see
// docs/replication.md. See docs/claims.md.
func (s *Store) Begin(ctx context.Context, db *sql.DB, req Request) (claim *Claim, replay *Result, err error) {
	if db == nil {
		return nil, nil, errors.New("idem: Begin needs a *sql.DB, got nil")
	}
	return s.BeginOn(ctx, NewSQLRunner(db, nil), req)
}

// BeginOn is [Store.Begin] on r, a pool through any driver's adapter
// (idempgx.New for a *pgxpool.Pool): its short transaction is one of
// r's, begun with r's options.
func (s *Store) BeginOn(ctx context.Context, r Runner, req Request) (claim *Claim, replay *Result, err error) {
	if isNil(r) {
		return nil, nil, errors.New("idem: Begin needs a pool, got nil")
	}
	defer s.observeBegin(ctx, req, startWatch(), &claim, &replay, &err)
	if err := req.validate(); err != nil {
		return nil, nil, err
	}
	if replay, hit, err := s.fromCache(ctx, req, true); hit {
		return nil, replay, err
	}
	var token int64
	err = InTx(ctx, r, sql.LevelDefault, func(tx Tx) error {
		var err error
		var cl acquired
		replay, cl, err = s.acquire(ctx, s.conn(tx), req, forBegin, nil)
		token = cl.token
		return err
	})
	switch {
	case err != nil:
		return nil, nil, err
	case replay != nil:
		return nil, replay, nil
	}
	return &Claim{s: s, req: req, token: token}, nil, nil
}

// Token is the claim's fencing token. It comes from the database's
// microsecond clock and grows with every takeover of the key, also across
// a purge of the record, so no two claims of one key ever share it.
func (c *Claim) Token() int64 { return c.token }

// RelayKey is the key to pass on as the idempotency key of the downstream
// provider the operation calls (for example Stripe's Idempotency-Key), so
// that a retry after a crash or a takeover does not repeat the provider's
// effect. It depends only on (Scope, Key): it is the same for every attempt
// and every takeover, and differs across scopes. It is "idem-" followed by
// 40 hex digits (45 visible ASCII characters), derived with SHA-256. Note
// that after the [Store]'s retention a key may be reused for another request;
// keep the retention at least as long as the provider remembers its keys.
func (c *Claim) RelayKey() string {
	return "idem-" + Fingerprint([]byte("idem relay key v1"), []byte(c.req.Scope), []byte(c.req.Key))[:40]
}

// Extend is the claim's heartbeat: it moves the end of the lease to at
// least d from now by the database clock (it never shortens the lease). It
// succeeds while no other request has taken the key, even after the lease
// ran out; once one has, or the claim was completed or released, it
// changes nothing and returns an error wrapping [ErrLeaseLost], and the
// caller should stop the work and not complete it. db may be a *sql.DB.
func (c *Claim) Extend(ctx context.Context, db DBTX, d time.Duration) error {
	if isNil(db) {
		return c.ExtendOn(ctx, nil, d)
	}
	return c.ExtendOn(ctx, sqlConn{db}, d)
}

// ExtendOn is [Claim.Extend] on db, through any driver's adapter (a
// Runner is one: a pool works).
func (c *Claim) ExtendOn(ctx context.Context, db Conn, d time.Duration) (err error) {
	if err := c.check(db, "Extend"); err != nil {
		return err
	}
	defer c.observeClaim(ctx, 0, startWatch(), &err)
	if err := checkDuration("Extend's duration", d); err != nil {
		return err
	}
	q := c.s.st.query(c.s.st.Extend, &values{req: c.req, token: c.token, lease: micros(d)})
	return c.fenced(ctx, c.s.conn(db), q, "extend the lease", "stop the work and do not complete it")
}

// Complete stores resp as the final result of the claim, through tx: the
// transaction that writes the operation's business rows, so that both
// commit or neither does. tx must be an open transaction, even where the
// operation writes no rows of its own: a pool or a connection is refused
// before any statement, as Do refuses it (see [DBTX]). It succeeds while
// no other request has taken the key, even after the lease ran out. Once
// one has, it changes nothing and returns an error wrapping
// [ErrLeaseLost]: the caller must roll back tx, which discards its
// business rows, since the new owner runs the operation.
func (c *Claim) Complete(ctx context.Context, tx DBTX, resp Response) error {
	if c == nil || c.s == nil {
		return c.check(sqlConn{tx}, "Complete")
	}
	tx, err := txOf(tx, "Complete")
	if err != nil {
		return err
	}
	return c.CompleteOn(ctx, sqlTx{sqlConn{tx}}, resp)
}

// CompleteOn is [Claim.Complete] in tx, the transaction that writes the
// operation's business rows, through any driver's adapter (idempgx.Tx
// for a pgx.Tx). CompleteOn never commits or rolls back tx.
func (c *Claim) CompleteOn(ctx context.Context, tx Tx, resp Response) (err error) {
	if err := c.check(tx, "Complete"); err != nil {
		return err
	}
	defer c.observeClaim(ctx, EventExecuted, startWatch(), &err)
	if err := resp.validate(); err != nil {
		return err
	}
	out, err := c.s.seal(c.req, resp)
	if err != nil {
		return err
	}
	q := c.s.completion(c.s.st.Complete, c.req, c.token, out, forBegin)
	sc, sent := c.s.conn(tx), monotonic()
	if err := c.fenced(ctx, sc, q, "complete", "roll back this transaction"); err != nil {
		return err
	}
	c.s.completed.add(c.req.Scope, c.req.Key)
	c.s.cacheCompleted(sc, c.req, out, sent)
	return nil
}

// Release ends the claim without a result, for an operation that did not
// happen (the provider declined to start, the input turned out invalid): the
// next attempt takes the key over at once and runs again, with a larger
// token. A release of a claim that is no longer current changes nothing and
// returns an error wrapping [ErrLeaseLost]. db may be a *sql.DB.
func (c *Claim) Release(ctx context.Context, db DBTX) error {
	if isNil(db) {
		return c.ReleaseOn(ctx, nil)
	}
	return c.ReleaseOn(ctx, sqlConn{db})
}

// ReleaseOn is [Claim.Release] on db, through any driver's adapter (a
// Runner is one: a pool works).
func (c *Claim) ReleaseOn(ctx context.Context, db Conn) (err error) {
	if err := c.check(db, "Release"); err != nil {
		return err
	}
	defer c.observeClaim(ctx, EventReleased, startWatch(), &err)
	q := c.s.st.query(c.s.st.Release, &values{req: c.req, token: c.token})
	return c.fenced(ctx, c.s.conn(db), q, "release", "the key is no longer this claim's to release")
}

// check refuses a nil Claim or handle, before any statement.
func (c *Claim) check(db Conn, method string) error {
	switch {
	case c == nil || c.s == nil:
		return fmt.Errorf("idem: %s on a nil Claim; use the claim Begin returned", method)
	case isNil(db):
		return fmt.Errorf("idem: %s needs a database handle, got nil", method)
	}
	return nil
}

// fenced runs a statement fenced on the claim's token. When it changes
// nothing, fenced reads the record to say why, once the dialect has said
// that the session's reads see every commit acknowledged before its
// transaction began (causalReads: a Galera node's may not), so that a
// record the read does not find is gone, not yet to be applied there.
func (c *Claim) fenced(ctx context.Context, sc conn, q Query, what, advice string) error {
	fail := func(err error, detail, hint string) error {
		return &Error{Op: what, Scope: c.req.Scope, Key: c.req.Key, Token: c.token, Err: err, Detail: detail, Hint: hint}
	}
	n, err := sc.exec(ctx, q)
	if err != nil {
		return fail(c.s.named(err), "", c.s.next(err))
	}
	if n == 1 {
		return nil
	}
	if err := c.s.dialect.causalReads(ctx, sc.c); err != nil {
		return err
	}
	var (
		status Status
		token  int64
	)
	err = sc.queryRow(ctx, c.s.st.query(c.s.st.State, &values{req: c.req}), &status, &token)
	var why string
	switch {
	case errors.Is(err, sql.ErrNoRows):
		why = "no longer exists (purged)"
	case err != nil:
		// The fenced statement changed nothing, so the claim is not
		// current: that is the error. The failed read is only why it
		// cannot say more; wrapped, its deadlock or lock wait timeout
		// would make the lease lost look retryable, and a retry of the
		// caller's transaction cannot get the claim back.
		return fail(ErrLeaseLost, "lease lost: it changed nothing, and reading the key to say why failed: "+err.Error(), advice)
	case token != c.token:
		why = fmt.Sprintf("was taken over by another request, whose token is %d", token)
	case status == StatusCompleted:
		why = "was already completed by this claim"
	case status == StatusReleased:
		why = "was already released by this claim"
	default:
		why = fmt.Sprintf("is %s and did not change", status)
	}
	return fail(ErrLeaseLost, "lease lost: the key "+why, advice)
}

// observeBegin reports the outcome of a Begin that began at start. It is
// deferred by Begin.
func (s *Store) observeBegin(ctx context.Context, req Request, start stopwatch, claim **Claim, replay **Result, err *error) {
	if s.observer == nil {
		return
	}
	ev, e := Event{Kind: EventReplayed, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed()}, *err
	switch {
	case *claim != nil:
		ev.Kind, ev.Token = EventClaimed, (*claim).token
	case e == nil && *replay == nil:
		e = ErrPanicked
	}
	s.observeErr(ctx, ev, e)
}

// observeClaim reports the outcome of a Claim's method that began at
// start: done when it succeeded (nothing for a zero done), lease lost or
// failed when it did not. It is deferred by Complete, Extend and Release.
func (c *Claim) observeClaim(ctx context.Context, done EventKind, start stopwatch, err *error) {
	if c.s.observer == nil || *err == nil && done == 0 {
		return
	}
	c.s.observeErr(ctx, Event{Kind: done, Scope: c.req.Scope, Key: c.req.Key, Operation: c.req.Operation,
		Duration: start.elapsed(), Token: c.token}, *err)
}
