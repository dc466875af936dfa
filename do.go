package idem

import (
	"context"
	"errors"
)

// DoOn is [Store.Do] in tx, the caller's open transaction through any
// driver's adapter (idempgx.Tx for a pgx.Tx): fn runs at most once per
// (Scope, Key) among all transactions that commit, and the record is
// written through tx. DoOn never commits or rolls back tx.
//
// When tx is a [Pipeline] (the transaction of [InPipelinedTx] on pgx:
// idemhttp's, idemgrpc's, the consumer middleware's, idempgx.RunTx's),
// the claim goes in one round trip with tx's BEGIN, and with the read of
// an existing record under READ COMMITTED, and the response is stored
// with tx's COMMIT, after DoOn has returned: a completion that fails then
// fails the commit, which does not commit, so the result DoOn returned
// counts only once tx has committed.
func (s *Store) DoOn(ctx context.Context, tx Tx, req Request, fn func(ctx context.Context) (Response, error)) (res Result, err error) {
	start := startWatch()
	switch {
	case isNil(tx):
		return Result{}, errors.New("idem: Do needs an open transaction, got nil")
	case fn == nil:
		return Result{}, errors.New("idem: Do needs a function to run, got nil")
	}
	defer s.observeDo(ctx, req, start, &res, &err)
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	return s.run(ctx, s.conn(tx), req, nil, fn)
}

// Apply is [Store.Do] for an operation whose response is known before it
// runs, such as a message consumer's acknowledgement or a webhook's 200:
// resp is stored with the claim of a new key, in one statement where Do's
// claim and its completion are two, and fn runs at most once per (Scope,
// Key) among all transactions that commit, as in Do. tx must be an open
// transaction, as Do's.
//
// When fn runs and returns nil, Apply returns resp with Replayed false;
// when an earlier execution completed, its stored response with Replayed
// true, and fn is not called; when fn returns an error, Apply returns it,
// removes its claim from tx and stores nothing, and the caller should
// roll back. A duplicate meets the record as it meets Do's: it waits for
// tx, then replays, or runs if tx rolled back. resp is checked (and
// sealed, with [WithSealer]) before the claim.
//
// Unlike Do, Apply runs no statement after fn when it claimed a new key,
// so it does not check that the database kept tx open while fn ran:
// MySQL and SQLite end a transaction whole at a deadlock or an
// interrupted write while the *sql.Tx stays open, and its statements
// after that commit on their own. fn must return the error of any
// statement of its that fails, as a handler that checks its errors does:
// then the caller rolls back. (On PostgreSQL a failed statement makes the
// COMMIT fail.)
func (s *Store) Apply(ctx context.Context, tx DBTX, req Request, resp Response, fn func(ctx context.Context) error) (Result, error) {
	tx, err := txOf(tx, "Apply")
	if err != nil {
		return Result{}, err
	}
	return s.ApplyOn(ctx, sqlTx{sqlConn{tx}}, req, resp, fn)
}

// ApplyOn is [Store.Apply] in tx, the caller's open transaction through
// any driver's adapter, as [Store.DoOn] is Do's. Through a [Pipeline] the
// claim goes with tx's BEGIN, as DoOn's, and tx's COMMIT goes alone.
func (s *Store) ApplyOn(ctx context.Context, tx Tx, req Request, resp Response, fn func(ctx context.Context) error) (res Result, err error) {
	start := startWatch()
	switch {
	case isNil(tx):
		return Result{}, errors.New("idem: Apply needs an open transaction, got nil")
	case fn == nil:
		return Result{}, errors.New("idem: Apply needs a function to run, got nil")
	}
	defer s.observeDo(ctx, req, start, &res, &err)
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	if err := resp.validate(); err != nil {
		return Result{}, err
	}
	out, err := s.seal(req, resp)
	if err != nil {
		return Result{}, err
	}
	return s.run(ctx, s.conn(tx), req, &out, func(ctx context.Context) (Response, error) { return resp, fn(ctx) })
}

// run is Do and Apply of a valid req through c: the claim (of a record
// stored completed with done, for Apply), fn, and the completion with
// fn's response where the claim did not store it already.
func (s *Store) run(ctx context.Context, c conn, req Request, done *storedResponse, fn func(ctx context.Context) (Response, error)) (Result, error) {
	if replay, hit, err := s.fromCache(ctx, req, true); hit {
		return resultOf(replay), err
	}
	sent := monotonic() // for the replay cache: before the claim, which sets the record's expiry
	replay, cl, err := s.acquire(ctx, c, req, forDo, done)
	if err != nil {
		return Result{}, err
	}
	if replay != nil {
		return *replay, nil
	}
	resp, err := fn(ctx)
	if err == nil {
		err = resp.validate()
	}
	if err != nil {
		return Result{}, s.unclaim(ctx, c, req, cl.token, err)
	}
	if cl.done {
		s.completed.add(req.Scope, req.Key)
		s.cacheCompleted(c, req, *done, sent)
		return Result{Response: resp}, nil
	}
	out := storedResponse{}
	if done != nil { // Apply's claim took a record over: it is a PROCESSING one
		out = *done
	} else if out, err = s.seal(req, resp); err != nil {
		return Result{}, err
	}
	if err := s.store(ctx, c, req, cl.token, out); err != nil {
		return Result{}, err
	}
	s.cacheCompleted(c, req, out, sent)
	return Result{Response: resp}, nil
}
