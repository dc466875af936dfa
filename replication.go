package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
)

// ErrNotReplicated reports that a commit had not reached the standbys
// asked for when the bound of [Store.WaitReplicated] ran out. The commit
// stands on the primary, but a failover now could lose it: the outcome
// of the call is unknown, and the client must retry with the same key,
// which either replays the record (it survived) or runs the call again
// (it was lost with the primary). The error is a *[NotReplicatedError].
// HTTP: 503 with Retry-After.
var ErrNotReplicated = errors.New("idem: the commit has not reached the standbys; the outcome is unknown: retry with the same key")

// NotReplicatedError is the error of [Store.WaitReplicated] when its bound
// runs out. errors.Is(err, [ErrNotReplicated]) reports true for it.
type NotReplicatedError struct {
	// Position is the primary's WAL position the commit was waited for
	// at, as PostgreSQL writes a pg_lsn ("0/3000148").
	Position string
	// Reached is how many standbys had flushed WAL up to Position when
	// the wait ended, Want how many were asked for.
	Reached, Want int
	// Waited is how long the wait lasted.
	Waited time.Duration
	// Err is the context's error when the wait ended with its context
	// rather than its bound; nil otherwise.
	Err error
}

func (e *NotReplicatedError) Error() string {
	msg := fmt.Sprintf("%v (WAL position %s reached %d of %d standbys in %v)", ErrNotReplicated, e.Position, e.Reached, e.Want, e.Waited.Round(time.Millisecond))
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, [ErrNotReplicated]) true.
func (e *NotReplicatedError) Is(target error) bool { return target == ErrNotReplicated }

// Unwrap returns Err: errors.Is(err, context.DeadlineExceeded) holds when
// the wait ended with its context's deadline.
func (e *NotReplicatedError) Unwrap() error { return e.Err }

// The pauses between two reads of the standbys' positions while answers
// wait: the first after the first read that finds them behind, doubled
// after each read up to the longest, and back to the first when another
// answer starts waiting.
const (
	firstReplicationPause = 100 * time.Microsecond
	maxReplicationPause   = time.Millisecond
)

// WaitReplicated waits, after a COMMIT of the caller's own, until that
// commit has reached standbys standbys of the PostgreSQL primary behind
// db, for at most within: so that an answer given after it survives a
// failover to any of them. It reads the primary's WAL position now (its
// flush position; under synchronous_commit off, the end of the WAL
// inserted), which is at or past the end of every transaction committed
// before the call (the caller's own, and the one a replay was read
// from), and returns once that many physical streaming standbys report
// WAL flushed to disk up to it (pg_stat_replication's flush_lsn: a
// promoted standby replays all it has flushed before it accepts writes,
// so flushed is enough, and cheaper than replay_lsn, which adds the
// standby's replay). docs/replication.md says why these positions.
//
// Past within it returns a *[NotReplicatedError] ([ErrNotReplicated]):
// the commit stands on the primary, but the answer must be "outcome
// unknown, retry with the same key", which is right whichever side of a
// failover the record lands on. The serving layers (idemhttp, idemgrpc,
// idemwatermill) call it through their Standbys option; a caller that
// runs Do in its own transaction calls it after its COMMIT, for a fresh
// result and a replay alike, and on pgx calls [Store.WaitReplicatedOn]
// with idempgx.Conn(pool).
//
// standbys must be at least 1 and within positive. The role must be
// allowed to read the standbys' positions (a superuser, or a member of
// pg_monitor or pg_read_all_stats); one that is not gets an error that
// says so at once, not a wait. Only PostgreSQL has it: other dialects
// return an error that names their own way ([Store.CheckWaitReplicated]).
// It costs a statement on a pooled connection, which ends the wait when
// the standbys have the commit already; then the waits on one handle
// share one read of the standbys' positions every 0.1 to 1 ms. An answer
// comes about a standby's round trip after its COMMIT:
// docs/replication.md has the figures.
func (s *Store) WaitReplicated(ctx context.Context, db *sql.DB, standbys int, within time.Duration) error {
	if db == nil {
		return errors.New("idem: WaitReplicated needs the *sql.DB of the primary, got nil")
	}
	return s.WaitReplicatedOn(ctx, sqlConn{db: db}, standbys, within)
}

// WaitReplicatedOn is [Store.WaitReplicated] on any driver's handle of the
// primary: a [Runner] (idempgx.New(pool, ...)), or a pool's [Conn]
// (idempgx.Conn(pool)). It must not be inside a transaction still open:
// what it waits for is what committed before it.
func (s *Store) WaitReplicatedOn(ctx context.Context, c Conn, standbys int, within time.Duration) error {
	if err := s.CheckWaitReplicated(); err != nil {
		return err
	}
	switch {
	case c == nil:
		return errors.New("idem: WaitReplicatedOn needs a handle of the primary, got nil")
	case isTx(c):
		return errors.New("idem: WaitReplicatedOn needs a pool of the primary, got a transaction: call it after the COMMIT, on the pool (a Runner, idempgx.Conn(pool))")
	case standbys < 1:
		return fmt.Errorf("idem: WaitReplicated needs at least 1 standby to wait for, got %d", standbys)
	case within <= 0:
		return fmt.Errorf("idem: WaitReplicated needs a positive bound, got %v", within)
	}
	start := time.Now()
	var (
		at, position string
		reached      int64
		readable     bool
	)
	if err := s.conn(c).queryRow(ctx, s.st.query(s.st.replicated, &values{}), &at, &position, &reached, &readable); err != nil {
		if ctx.Err() != nil {
			return &NotReplicatedError{Want: standbys, Waited: time.Since(start), Err: ctx.Err()}
		}
		return &Error{Op: "wait for the standbys", Err: err, Hint: s.advice(err, hintUnknownOutcome)}
	}
	if reached >= int64(standbys) {
		return nil
	}
	if !readable {
		return &Error{Op: "wait for the standbys", Err: errors.New("the role cannot read the standbys' positions in pg_stat_replication"),
			Hint: "grant it pg_monitor (GRANT pg_monitor TO the role), or connect as a role that has it"}
	}
	target, err := strconv.ParseUint(at, 10, 64)
	if err != nil {
		return &Error{Op: "wait for the standbys", Err: fmt.Errorf("a WAL position that is not a number of bytes: %q", at), Hint: hintUnknownOutcome}
	}
	w := &standbyWaiter{at: target, want: standbys, reached: int(reached), done: make(chan error, 1)}
	s.watches.add(s, c, w)
	t := time.NewTimer(within - time.Since(start))
	defer t.Stop()
	select {
	case err := <-w.done:
		if err != nil {
			return &Error{Op: "wait for the standbys", Err: err, Hint: s.advice(err, hintUnknownOutcome)}
		}
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	reached = int64(s.watches.remove(w))
	select {
	case err := <-w.done: // the read that ended the wait came first
		if err == nil {
			return nil
		}
	default:
	}
	return &NotReplicatedError{Position: position, Reached: int(reached), Want: standbys, Waited: time.Since(start), Err: ctx.Err()}
}

// isTx reports whether c is a transaction, whose statements the wait's
// reads, on a goroutine of their own, must not share.
func isTx(c Conn) bool {
	_, ok := c.(Tx)
	return ok
}

// hintUnknownOutcome is the Hint of a wait for the standbys that failed.
const hintUnknownOutcome = "the commit stands on the primary but may not survive a failover: answer that the outcome is unknown, and let the client retry with the same key"

// add adds w to the waits on c, starting their loop when it is the
// first.
func (ws *standbyWatches) add(s *Store, c Conn, w *standbyWaiter) {
	var key any = w
	if reflect.ValueOf(c).Comparable() {
		key = c
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.on == nil {
		ws.on = map[any]*standbyWatch{}
	}
	if watch, ok := ws.on[key]; ok {
		watch.waiters[w] = struct{}{}
		select {
		case watch.wake <- struct{}{}:
		default:
		}
		return
	}
	watch := &standbyWatch{waiters: map[*standbyWaiter]struct{}{w: {}}, wake: make(chan struct{}, 1)}
	ws.on[key] = watch
	go ws.loop(s, s.conn(c), key, watch)
}

// loop reads the standbys' positions on c until no wait is left on it,
// and ends each wait that they have reached, or that a read failed.
func (ws *standbyWatches) loop(s *Store, c conn, key any, watch *standbyWatch) {
	pause := firstReplicationPause
	for {
		var flushed []uint64
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.queryRows(ctx, s.st.query(s.st.flushed, &values{}), func(scan func(dest ...any) error) error {
			var b string
			if err := scan(&b); err != nil {
				return err
			}
			n, err := strconv.ParseUint(b, 10, 64)
			if err != nil {
				return fmt.Errorf("a WAL position that is not a number of bytes: %q", b)
			}
			flushed = append(flushed, n)
			return nil
		})
		cancel()
		ws.mu.Lock()
		for w := range watch.waiters {
			w.reached = 0
			for _, f := range flushed {
				if f >= w.at {
					w.reached++
				}
			}
			if err != nil || w.reached >= w.want {
				w.done <- err
				delete(watch.waiters, w)
			}
		}
		if len(watch.waiters) == 0 {
			delete(ws.on, key)
			ws.mu.Unlock()
			return
		}
		ws.mu.Unlock()
		t := time.NewTimer(pause)
		select {
		case <-t.C:
			pause = min(2*pause, maxReplicationPause)
		case <-watch.wake:
			t.Stop()
			pause = firstReplicationPause
		}
	}
}

// CheckWaitReplicated reports whether the Store's dialect can wait for
// standbys ([Store.WaitReplicated]): nil on PostgreSQL, else an error
// that names what the database offers instead (MariaDB's and MySQL's
// semi-synchronous replication). The serving layers call it when their
// Standbys option is set, so that the setting is refused when they are
// configured, never later.
func (s *Store) CheckWaitReplicated() error {
	if s.st.replicated.SQL == "" {
		return fmt.Errorf("idem: waiting for standbys is not supported on %s: %s", s.dialect.Name(), s.st.NoReplicationWait)
	}
	return nil
}
