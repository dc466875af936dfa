package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// maxContention bounds how often acquire looks again after losing a race
// (the record vanished, or another request took it over first).
const maxContention = 4

// caller is which of the Store's calls a claim is made for.
type caller bool

const (
	// forDo: the claim commits or rolls back with the caller's
	// transaction.
	forDo caller = false
	// forBegin: the claim outlives its short transaction, so it must not
	// be committed with its lease already run out (restamp).
	forBegin caller = true
)

// acquired is a claim that acquire made: its token, and whether its
// record is completed already (done: Apply's claim of a new record, which
// stored its response with it).
type acquired struct {
	token int64
	done  bool
}

// acquire claims (Scope, Key) in c for by, or returns the stored result
// to replay (take), once the dialect has checked the transaction's
// settings (checkSession; Begin's claim, which a later transaction
// completes, refuses a session without causal reads where its dialect
// needs them), with its lock waits bounded when the Store has
// WithLockTimeout: a wait that runs out is an *InFlightError, and c is
// left as it was before. A statement of the bound that fails is reported
// like one of take's. done, for Apply, is the response to store with a
// new record's claim (see take).
func (s *Store) acquire(ctx context.Context, c conn, req Request, by caller, done *storedResponse) (*Result, acquired, error) {
	if err := s.dialect.checkSession(ctx, c.c); err != nil {
		return nil, acquired{}, err
	}
	if !s.hasLockWait {
		return s.take(ctx, c, req, by, done)
	}
	// Where the read first waits for no holder (a plain read, on
	// PostgreSQL), it runs before the bound: a replay it finds costs none of
	// the bound's statements.
	read := false
	if s.st.readFirstWhenReplaying {
		replay, cl, tried, err := s.readFirst(ctx, c, req)
		if replay != nil || err != nil {
			return replay, cl, err
		}
		read = tried
	}
	var (
		replay  *Result
		cl      acquired
		takeErr error
	)
	timedOut, err := s.dialect.lockWaiter()(ctx, c, s.lockWait, func() error {
		if s.st.readFirstWhenReplaying {
			replay, cl, takeErr = s.claim(ctx, c, req, by, done, read)
		} else {
			replay, cl, takeErr = s.take(ctx, c, req, by, done)
		}
		return takeErr
	})
	switch {
	case timedOut:
		return nil, acquired{}, inFlight(s.lockWait)
	case err != nil && err != takeErr:
		return nil, acquired{}, s.stmtErr("claim", req, err)
	}
	return replay, cl, err
}

// restampAfter is how long a claim statement may have run before its claim
// was granted (it waited for another transaction that held the key) and
// still keep the lease it computed when it started; past it, Begin moves
// the lease's end to a full lease from now.
const restampAfter = 10 * time.Millisecond

// take claims (Scope, Key) inside c and returns the claim's token, or
// returns the stored result to replay. c is the caller's transaction in Do
// and a short transaction of its own in Begin. A key the Store has served
// lately (completed), or a request ctx says is a retry (WithRetryHint), is
// read first, by a read that finds only a record completed within
// retention (readCompleted), a state no other request leaves until
// retention passes, and replayed from it; when it finds none, the key goes
// on to the claim as if it had not run. The insert waits on the
// row lock of any other open transaction that holds the key, so of concurrent
// requests exactly one proceeds; the others see its committed outcome. A
// record that is forgotten, released or whose lease expired is taken over
// with an update fenced on the token read and on the record still being
// free, so two takeovers of one record have one winner, and a claim
// completed or extended since the read is not taken.
//
// The token fences every later statement on the claim. For Begin (by is
// forBegin), whose claim outlives c, a claim statement that waited longer
// than restampAfter for the key has its lease counted again from now, so
// that a claim is never committed with its lease already run out. For
// Apply (done is its response), a new record is inserted completed, with
// done stored, and the claim says so; a record taken over is a
// PROCESSING claim as Do's, which Apply completes after fn.
func (s *Store) take(ctx context.Context, c conn, req Request, by caller, done *storedResponse) (replay *Result, cl acquired, err error) {
	replay, cl, read, err := s.readFirst(ctx, c, req)
	if replay != nil || err != nil {
		return replay, cl, err
	}
	return s.claim(ctx, c, req, by, done, read)
}

// readFirst is take's read before the claim: of a key the Store has
// served lately, of a request ctx says is a retry, and, where the
// dialect's read locks nothing, of any key while most keys the Store did
// not know replayed. It returns the replay of a completed record within
// retention, or the error of a request that does not match it; read
// reports whether it read, to no replay.
func (s *Store) readFirst(ctx context.Context, c conn, req Request) (replay *Result, cl acquired, read bool, err error) {
	known := s.completed.has(req.Scope, req.Key) || retryHinted(ctx)
	if !known && !(s.st.readFirstWhenReplaying && s.completed.replaysMostly()) {
		return nil, acquired{}, false, nil
	}
	rec, found, err := s.readCompleted(ctx, c, req)
	if err != nil {
		return nil, acquired{}, true, err
	}
	if !known {
		s.completed.saw(found && rec.matches(req))
	}
	if !found {
		return nil, acquired{}, true, nil
	}
	if replay, cl, err = s.replayed(req, rec); err == nil {
		s.cacheRead(c, req, rec, replay.Response)
	}
	return replay, cl, true, err
}

// claim is take's claim of req's key, after readFirst (read: it read the
// record first, and found nothing to replay).
func (s *Store) claim(ctx context.Context, c conn, req Request, by caller, done *storedResponse, read bool) (replay *Result, cl acquired, err error) {
	lease, start := micros(s.lease), startWatch()
	if !read {
		defer func() { s.completed.saw(replay != nil) }()
	}
	for range maxContention {
		var (
			ok     bool
			token  int64
			waited time.Duration
			rec    keyRecord
			found  bool
			err    error
		)
		if c.p != nil && by == forDo {
			ok, token, rec, found, err = s.claimAndRead(ctx, c, req, lease, done)
		} else if ok, token, waited, err = s.claimNew(ctx, c, req, lease, by, done); err != nil {
			err = s.stmtErr("claim", req, err)
		}
		if err != nil {
			return nil, acquired{}, err
		}
		if ok {
			return nil, acquired{token: token, done: done != nil}, s.restamp(ctx, c, req, by, token, waited)
		}
		if !found { // not read with the claim, or the read found none
			if rec, found, err = s.read(ctx, c, req); err != nil {
				return nil, acquired{}, err
			}
			if !found {
				continue // deleted since the insert saw it: claim it afresh
			}
		}
		if !rec.forgotten {
			switch {
			case !rec.matches(req):
				return nil, acquired{}, mismatchError(req, rec)
			case rec.expired:
				return nil, acquired{}, s.expired(req, rec)
			case rec.status == StatusCompleted:
				return s.replayed(req, rec)
			case rec.status == StatusProcessing && rec.leaseLeft > 0:
				return nil, acquired{}, inFlight(rec.leaseLeft)
			}
		}
		takeover := s.st.query(s.st.Takeover, &values{req: req, token: rec.token, lease: lease, expiry: s.expiry(req, by),
			retention: micros(s.retention), keyMemory: micros(s.keyMemory)})
		ok, token, waited, err = s.claimRow(ctx, c, req, takeover, byTakeover, by)
		if err != nil {
			return nil, acquired{}, s.stmtErr("take over", req, err)
		}
		if ok {
			s.observe(ctx, Event{Kind: EventTakeover, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed(), Token: rec.token})
			return nil, acquired{token: token}, s.restamp(ctx, c, req, by, token, waited)
		}
		// Another request took the record over, or its owner completed or
		// extended it, since the read: look again.
	}
	return nil, acquired{}, &Error{Op: "claim", Scope: req.Scope, Key: req.Key, Err: errContended,
		Detail: "the key changed hands repeatedly while being claimed: each time, another request took it over or it was deleted first",
		Hint:   hintRetry}
}

// replayed returns the response of rec, a completed record within
// retention, for req, and remembers the key as completed; or the error of
// a request that does not match it, which opens nothing.
func (s *Store) replayed(req Request, rec keyRecord) (*Result, acquired, error) {
	if !rec.matches(req) {
		return nil, acquired{}, mismatchError(req, rec)
	}
	resp, err := s.response(req, rec)
	if err != nil {
		return nil, acquired{}, err
	}
	s.completed.add(req.Scope, req.Key)
	return &Result{Response: resp, Replayed: true}, acquired{}, nil
}

// expiry is the expiry of a new claim of req for by from now, in µs.
// Do's claim commits with its response, in one transaction, so its
// record replays for its retention from the claim, and its completion
// leaves the expiry as it is (so that on PostgreSQL its update changes
// no indexed column and stays HOT). Begin's claim commits alone and may
// run for its lease before its completion sets the expiry anew: until
// then it expires after its lease and its retention.
func (s *Store) expiry(req Request, by caller) int64 {
	if by == forDo {
		return micros(s.retentionOf(req))
	}
	return micros(s.lease) + micros(s.retentionOf(req))
}

// claimNew claims req's key as a new record for by. Do's claim carries a
// token of Do's own (ownToken), so its statement returns nothing and is
// followed by no read; Begin's takes its token from the database clock,
// which claimRow reads. With done (Apply's), the record is inserted
// completed, with done stored.
func (s *Store) claimNew(ctx context.Context, c conn, req Request, lease int64, by caller, done *storedResponse) (ok bool, token int64, waited time.Duration, err error) {
	if by == forBegin {
		return s.claimRow(ctx, c, req, s.st.query(s.st.Insert, &values{req: req, lease: lease, expiry: s.expiry(req, by)}), byInsert, by)
	}
	token = ownToken()
	ok, err = s.dialect.inserted(c.exec(ctx, s.ownClaim(req, token, lease, done)))
	return ok, token, 0, err
}

// ownClaim is the statement of a new claim of Do's (InsertOwn) with
// token, or of Apply's (InsertDone), which stores done with it.
func (s *Store) ownClaim(req Request, token, lease int64, done *storedResponse) Query {
	v := &values{req: req, token: token, lease: lease, expiry: s.expiry(req, forDo), memory: micros(s.keyMemoryOf(req))}
	if done == nil {
		return s.st.query(s.st.InsertOwn, v)
	}
	v.resp, v.header, v.body, v.sealedKey, v.ref = done.resp, done.header, done.body, done.keyID, done.ref
	return s.st.query(s.st.InsertDone, v)
}

// claimAndRead is claimNew of Do's (or Apply's) claim through c's
// Pipeline, with readAfterClaim in the same round trip (and BEGIN in it,
// when the claim is the transaction's first statement): when the claim
// finds the key's record, found reports that the read found it too, and
// rec is what it read. Where the read cannot see the record (not READ
// COMMITTED), or it went in the meantime, found is false, and take reads
// it on its own.
func (s *Store) claimAndRead(ctx context.Context, c conn, req Request, lease int64, done *storedResponse) (ok bool, token int64, rec keyRecord, found bool, err error) {
	token = ownToken()
	qs := []Query{
		c.sent(s.ownClaim(req, token, lease, done)),
		c.sent(s.st.query(s.st.readAfterClaim, &values{req: req, retention: micros(s.retention), keyMemory: micros(s.keyMemory)})),
	}
	read := false // the claim ran: an error is the read's
	err = c.p.Batch(ctx, qs, func(r Results) error {
		var err error
		if ok, err = s.dialect.inserted(r.Exec()); err != nil {
			return err
		}
		read = true
		if ok {
			_, err = r.Exec() // the claim's own record, which nothing needs
			return err
		}
		var leaseLeft int64
		switch err = r.QueryRow(rec.into(&leaseLeft)...); {
		case err == nil:
			found, rec.leaseLeft = true, time.Duration(leaseLeft)*time.Microsecond
		case errors.Is(err, sql.ErrNoRows):
			err = nil
		}
		return err
	})
	if err != nil {
		what := "claim"
		if read {
			what = "read the record"
		}
		return false, 0, keyRecord{}, false, s.stmtErr(what, req, err)
	}
	return ok, token, rec, found, nil
}

// ownToken is the token of a new claim of Do's: a random negative number.
// The token of a claim of Begin's is the database clock in microseconds
// since the Unix epoch (positive), or grows from the token before it, and
// orders its claims, because it leaves the process (Claim.Token, for the
// provider's fencing). Do's claim never leaves the caller's transaction:
// its token only has to differ from that of every other claim of the key,
// so that its statements after fn, fenced on it, change nothing once the
// claim is not this transaction's own. A takeover of its record later
// grows the token from the clock (GREATEST(token + 1, now)), as from any
// token before it.
func ownToken() int64 { return -1 - rand.Int64N(math.MaxInt64) }

// claimStatement is which statement claims a record.
type claimStatement bool

const (
	byInsert   claimStatement = true  // a new record
	byTakeover claimStatement = false // a record that is free again
)

// claimRow runs q, the claim statement stmt, and reports whether it
// claimed the record, the claim's token and, for Begin, how long after
// the statement's start the claim was granted: from q itself where the
// dialect's statement returns them, else by reading them in c.
func (s *Store) claimRow(ctx context.Context, c conn, req Request, q Query, stmt claimStatement, by caller) (ok bool, token int64, waited time.Duration, err error) {
	var lag int64
	returns := s.st.TakeoverReturns
	if stmt == byInsert {
		returns = s.st.InsertReturns
	}
	n := int64(1) // rows claimed; a row returned is one
	if returns.Token {
		dest := []any{&token, &lag}
		if !returns.Lag {
			dest = dest[:1]
		}
		if err = c.queryRow(ctx, q, dest...); errors.Is(err, sql.ErrNoRows) {
			n, err = 0, nil
		}
	} else {
		n, err = c.exec(ctx, q)
	}
	ok = err == nil && n == 1
	if stmt == byInsert {
		ok, err = s.dialect.inserted(n, err)
	}
	if err != nil || !ok {
		return false, 0, 0, err
	}
	if !returns.Token || by == forBegin && !returns.Lag {
		if err := c.queryRow(ctx, s.st.query(s.st.Claimed, &values{req: req}), &token, &lag); err != nil {
			return false, 0, 0, err
		}
	}
	return true, token, time.Duration(lag) * time.Microsecond, nil
}

// restamp moves the lease of Begin's claim to a full lease from now when
// its statement waited longer than restampAfter, fenced on its token.
func (s *Store) restamp(ctx context.Context, c conn, req Request, by caller, token int64, waited time.Duration) error {
	if by != forBegin || waited <= restampAfter {
		return nil
	}
	n, err := c.exec(ctx, s.st.query(s.st.Extend, &values{req: req, token: token, lease: micros(s.lease), keep: micros(s.retentionOf(req))}))
	if err == nil && n != 1 {
		err = fmt.Errorf("%d records changed, want 1", n)
	}
	if err != nil {
		return s.stmtErr("count the lease from the claim", req, err)
	}
	return nil
}

// read reads the record of (Scope, Key); found is false when there is none.
func (s *Store) read(ctx context.Context, c conn, req Request) (rec keyRecord, found bool, err error) {
	var leaseLeft int64
	q := s.st.query(s.st.Read, &values{req: req, retention: micros(s.retention), keyMemory: micros(s.keyMemory)})
	err = c.queryRow(ctx, q, rec.into(&leaseLeft)...)
	if errors.Is(err, sql.ErrNoRows) {
		return keyRecord{}, false, nil
	}
	if err != nil {
		return keyRecord{}, false, s.stmtErr("read the record", req, err)
	}
	rec.leaseLeft = time.Duration(leaseLeft) * time.Microsecond
	return rec, true, nil
}

// readCompleted reads the record of (Scope, Key) when it is completed and
// within its expiry, with what its replay needs; found is false for any
// other record, and when there is none.
func (s *Store) readCompleted(ctx context.Context, c conn, req Request) (rec keyRecord, found bool, err error) {
	var left int64      // µs until its expiry
	sent := monotonic() // the replay cache's deadline counts from before the read
	err = c.queryRow(ctx, s.st.query(s.st.ReadCompleted, &values{req: req, retention: micros(s.retention)}),
		&rec.operation, &rec.fingerprint, &rec.code, &rec.header, &rec.body, &rec.sealedKey, &left, &rec.ref)
	if errors.Is(err, sql.ErrNoRows) {
		return keyRecord{}, false, nil
	}
	if err != nil {
		return keyRecord{}, false, s.stmtErr("read the record", req, err)
	}
	rec.status = StatusCompleted
	if c.commit != nil {
		if d := life(time.Duration(left) * time.Microsecond); d > 0 {
			rec.until = sent.Add(d)
		}
	}
	return rec, true, nil
}

// store stores out as the final result of Do's claim, fenced on its
// token. A claim that is gone means the database ended the transaction.
// Through a Pipeline, the completion waits to go with the COMMIT (Defer),
// as completeLast, whose failure then is the commit's.
func (s *Store) store(ctx context.Context, c conn, req Request, token int64, out storedResponse) error {
	if c.p != nil {
		q := s.completion(s.st.completeLast, req, token, out, forDo)
		c.p.Defer(c.sent(q), func(err error) error {
			switch {
			case err == nil:
				s.completed.add(req.Scope, req.Key)
				return nil
			case s.dialect.claimGone()(err):
				return txEnded("store the response", req, token, nil)
			}
			return s.stmtErr("store the response", req, err)
		})
		return nil
	}
	n, err := c.exec(ctx, s.completion(s.st.Complete, req, token, out, forDo))
	switch {
	case err != nil:
		return s.stmtErr("store the response", req, err)
	case n != 1:
		return txEnded("store the response", req, token, nil)
	}
	s.completed.add(req.Scope, req.Key)
	return nil
}

// completion is st (complete, or completeLast), which stores out as the
// final result of req's claim with token, made for by: Do's keeps the
// expiry its claim set (see expiry), a Claim's counts its retention from
// now.
func (s *Store) completion(st Statement, req Request, token int64, out storedResponse, by caller) Query {
	v := &values{req: req, token: token, resp: out.resp, header: out.header, body: out.body, sealedKey: out.keyID, ref: out.ref,
		memory: micros(s.keyMemoryOf(req))}
	if by == forBegin {
		v.keep = micros(s.retentionOf(req))
	}
	return s.st.query(st, v)
}

// unclaim removes Do's claim after fn failed with cause, fenced on its
// token, and returns the error Do returns. It is best effort: if the
// caller commits anyway, the key stays free. A statement that fails means
// the transaction is unusable and must be rolled back, which cause says;
// a claim that is gone means the database ended the transaction.
func (s *Store) unclaim(ctx context.Context, c conn, req Request, token int64, cause error) error {
	if n, err := c.exec(ctx, s.st.query(s.st.Remove, &values{req: req, token: token})); err == nil && n == 0 {
		return txEnded("remove the claim", req, token, cause)
	}
	return cause
}

// next is advice for a statement inside a transaction (Do's, a Claim's):
// roll it back, or run it again whole where a retry may cure err.
func (s *Store) next(err error) string {
	switch a := s.advice(err, ""); {
	case a != "":
		return a + "; " + hintRollBack
	case IsRetryable(err) || s.dialect.retryable(err):
		return hintRetry
	}
	return hintRollBack
}

// stmtErr reports that one of idem's statements failed: what idem was
// doing, for which key, the database's error, and what to do next.
func (s *Store) stmtErr(what string, req Request, err error) error {
	return &Error{Op: what, Scope: req.Scope, Key: req.Key, Err: s.named(err), Hint: s.next(err), retry: s.dialect.retryable(err)}
}

// txEnded reports that Do's statement after fn (what) found no claim of
// its own to change, wrapping cause (fn's error) when there is one. MySQL
// and SQLite end a transaction whole at a deadlock, a lock wait timeout
// with innodb_rollback_on_timeout, or an interrupted write, while the
// *sql.Tx stays open: the statement then ran on its own and, fenced on the
// token, changed nothing. A retry of the whole transaction replays the
// result of whoever holds the key now, or runs again.
func txEnded(what string, req Request, token int64, cause error) error {
	e := &Error{Op: what, Scope: req.Scope, Key: req.Key, Token: token, Err: errTxEnded,
		Detail: "the transaction was rolled back by the database: this statement changed nothing, since the claim this transaction made is gone " +
			"(a deadlock or an interrupted statement ends the transaction on MySQL and SQLite while the *sql.Tx stays open; or a statement in it deleted or changed the claim)",
		Hint: "roll back and retry (RunTx and Retry do so): the retry replays the result of whoever holds the key now, or runs again"}
	if cause != nil {
		e.Err = fmt.Errorf("%w; fn's error: %w", errTxEnded, cause)
		e.Detail += "; fn's error: " + reason(cause)
	}
	return e
}

// expired reports that req's key has a record whose response is gone,
// kept by the key memory, with the reference it kept (rec's).
func (s *Store) expired(req Request, rec keyRecord) error {
	ee := &ExpiredError{}
	ee.Reference, ee.ReferenceErr = s.openRef(req, rec.ref)
	hint := "do not retry with this key: look the outcome up another way, or send a new request with a new key"
	if ee.Reference != "" {
		hint = "do not retry with this key: fetch what it created (" + ee.Reference + "), or send a new request with a new key"
	}
	return &Error{Op: "claim", Scope: req.Scope, Key: req.Key, Err: ee,
		Detail: "the key was used and its response is gone: its retention has passed, and the Store keeps the key for its key memory; nothing ran",
		Hint:   hint}
}
