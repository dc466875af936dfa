package idemserve

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

const (
	// DefaultTimeout is the default of [Config.Timeout]: 30 s, the Store's
	// default lease ([idem.DefaultLease]). In [ModeClaim] the default is
	// the Store's lease when that is shorter.
	DefaultTimeout = 30 * time.Second
	// DefaultRetryAfter is the default of [Config.RetryAfter]: 1 s.
	DefaultRetryAfter = time.Second
	// DefaultStandbyWait is the default of [Config.StandbyWait]: 5 s.
	DefaultStandbyWait = 5 * time.Second
)

// Mode says how a layer runs a handler.
type Mode int

const (
	// ModeTransaction (the default) begins a transaction, then runs the
	// handler inside [idem.Store.DoOn]: a duplicate waits for the first
	// call (in memory in this process, on the row lock in another) and
	// replays its result. The transaction stays open while the handler
	// runs, so the handler must be quick.
	ModeTransaction Mode = iota
	// ModeClaim commits a claim on the key with [idem.Store.BeginOn], then
	// runs the handler with no transaction open, for handlers that call a
	// slow external service (a payment provider): the handler passes
	// ClaimFrom(ctx).RelayKey() on as the provider's idempotency key, then
	// writes its rows through its driver's TxFrom, whose first call begins
	// the transaction. The claim is completed in that transaction with the
	// handler's answer, and committed. A duplicate that arrives meanwhile
	// is told to retry later, not made to wait.
	ModeClaim
)

// Config configures a [Server].
type Config struct {
	// Layer names the package serving, in errors and logs: "idemhttp",
	// "idemgrpc", ...
	Layer string
	// Store records the keys; its table must exist.
	Store *idem.Store
	// DB is the database/sql pool the transactions run on, the one
	// holding the Store's table and the handler's rows, and TxOptions
	// the options of every transaction of the handler's (nil: the
	// database's defaults); or Runner, in their place, runs the
	// transactions on another driver's pool (idempgx.New for pgx).
	DB        *sql.DB
	TxOptions *sql.TxOptions
	Runner    idem.Runner
	// Mode is [ModeTransaction] (the default) or [ModeClaim].
	Mode Mode
	// Timeout bounds the work of a call that holds its key, and how long
	// a duplicate in this process waits in memory for the call ahead of
	// it when the Store has no lock timeout (with one, that bounds the
	// wait, as it bounds a wait on the row lock). Default
	// [DefaultTimeout]; in ModeClaim it must not exceed the Store's lease,
	// which is its default when shorter, so that no retry takes over a
	// claim whose handler may still be running.
	Timeout time.Duration
	// RetryAfter is when a client told to retry (the key is in flight,
	// taken over, or contended) should: when a retry is likely to succeed,
	// not when it is sure to. Default [DefaultRetryAfter]; a call in
	// flight is never told more than the lease left on the claim that
	// holds the key, nor more than the Store's lock timeout.
	RetryAfter time.Duration
	// Logger receives what goes wrong after the answer is decided (a
	// claim that could not be released). Default [slog.Default].
	Logger *slog.Logger
	// Standbys, when positive, acknowledges only what survives a
	// failover: every answer read from or written to the Store's table
	// (a fresh result, a replay, a mismatch, an expired key), and the
	// answer of a call without a key once its transaction committed,
	// waits until the primary's WAL at the moment of answering has
	// reached this many standbys ([idem.Store.WaitReplicated]), for a
	// replay's record may have been committed a moment ago and be as
	// losable as a fresh one.
	// Past StandbyWait the answer is [NotReplicated]: outcome unknown,
	// retry with the same key. PostgreSQL only: New refuses it on
	// another dialect, naming what that database offers instead.
	Standbys int
	// StandbyWait bounds that wait. Default [DefaultStandbyWait].
	StandbyWait time.Duration
}

// Server serves calls under their idempotency keys, as [Config] says; it
// is safe for concurrent use.
type Server struct {
	cfg  Config
	gate gate // ModeTransaction: one call per key at the database
	// unopenable holds the key IDs of the records that could not be
	// opened, logged once each (Outcome).
	unopenable sync.Map // string -> struct{}
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Server, error) {
	fail := func(format string, args ...any) (*Server, error) {
		return nil, fmt.Errorf(cfg.Layer+": "+format, args...)
	}
	switch {
	case cfg.Store == nil:
		return fail("Config needs a Store, the *idem.Store that records the keys")
	case cfg.DB != nil && cfg.Runner != nil:
		return fail("Config has both a DB and a Runner: set DB (and TxOptions) for database/sql, or Runner for another driver's pool")
	case cfg.Runner != nil && cfg.TxOptions != nil:
		return fail("Config.TxOptions are database/sql's: with a Runner, give its options to the Runner (idempgx.New(pool, pgx.TxOptions{...}))")
	case cfg.DB == nil && cfg.Runner == nil:
		return fail("Config needs the database its transactions run on: a *sql.DB (DB), or a Runner of another driver's (idempgx.New for a *pgxpool.Pool)")
	case cfg.Mode != ModeTransaction && cfg.Mode != ModeClaim:
		return fail("unknown Mode %d", cfg.Mode)
	case cfg.Timeout < 0 || cfg.RetryAfter < 0:
		return fail("Timeout and RetryAfter must not be negative, got %v and %v", cfg.Timeout, cfg.RetryAfter)
	case cfg.Standbys < 0 || cfg.StandbyWait < 0:
		return fail("Standbys and StandbyWait must not be negative, got %d and %v", cfg.Standbys, cfg.StandbyWait)
	case cfg.Standbys == 0 && cfg.StandbyWait != 0:
		return fail("StandbyWait %v is set but Standbys is 0: set Standbys, how many standbys an answer waits for", cfg.StandbyWait)
	}
	if cfg.Standbys > 0 {
		if err := cfg.Store.CheckWaitReplicated(); err != nil {
			return fail("Standbys: %w", err)
		}
		if cfg.StandbyWait == 0 {
			cfg.StandbyWait = DefaultStandbyWait
		}
	}
	if cfg.DB != nil {
		cfg.Runner = idem.NewSQLRunner(cfg.DB, cfg.TxOptions)
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	lease := cfg.Store.Lease()
	switch {
	case cfg.Timeout == 0 && cfg.Mode == ModeClaim:
		cfg.Timeout = min(DefaultTimeout, lease)
	case cfg.Timeout == 0:
		cfg.Timeout = DefaultTimeout
	case cfg.Mode == ModeClaim && cfg.Timeout > lease:
		return fail("Timeout %v exceeds the Store's lease %v: in ModeClaim a retry may take over a claim whose handler is still running; lower Timeout or raise the lease (idem.WithLease)", cfg.Timeout, lease)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg}, nil
}

// Store returns the Store the Server records keys with.
func (s *Server) Store() *idem.Store { return s.cfg.Store }

// Logger returns the logger of [Config.Logger], for the layer's own
// logs.
func (s *Server) Logger() *slog.Logger { return s.cfg.Logger }

// Call is one call of a handler, as a layer hands it to [Server.Serve].
type Call struct {
	// Request is the call's idempotency request, or nil for a call
	// without a key: it runs in a transaction all the same (in ModeClaim,
	// one the handler begins when it asks for it), with nothing recorded,
	// so a retry runs it again.
	Request *idem.Request
	// Retry reports that the client says it is resending the call (an
	// Idempotency-Attempt header, gRPC's retry metadata): a hint to read
	// the key's record before claiming it ([idem.WithRetryHint]).
	Retry bool
	// Run runs the handler on ctx, which carries its transaction, claim
	// and request ([TxFrom], [ClaimFrom], [RequestFrom]), and returns its
	// answer to store, or an error when the answer is none to store (the
	// layer's own, which Serve passes back as it is: a server error, an
	// answer the layer cannot record).
	Run func(ctx context.Context) (idem.Response, error)
	// Answer, when not nil, is the answer the call stores, known before
	// Run runs (a message consumer's acknowledgement): Run's own answer
	// is then not stored, only its error counts. In ModeTransaction the
	// handler runs inside [idem.Store.ApplyOn], whose claim of a new key
	// stores Answer with it: one statement where DoOn's claim and
	// completion are two.
	Answer *idem.Response
}

// Serve serves c: it returns the result, fresh (Replayed false: the
// answer Run returned, committed) or replayed (Run did not run), or an
// error: Run's own, one whose [Server.Outcome] says what to tell the
// client, or ctx's error when the client went while its call waited for
// another with its key. With [Config.Standbys], a result, a mismatch and
// an expired key come back only once the standbys have the commit they
// rest on, and an error of kind [NotReplicated] in their place past
// [Config.StandbyWait].
// With a Store that has a replay cache ([idem.WithReplayCache]), a call
// the cache answers ([idem.Store.Cached]) is answered without a wait at
// the key gate, a transaction or a claim (with Config.Standbys, only once
// the standbys have the primary's commits).
func (s *Server) Serve(ctx context.Context, c Call) (idem.Result, error) {
	if c.Request != nil {
		if res, ok, err := s.cfg.Store.Cached(ctx, *c.Request); ok {
			// The replay cache answered: no wait, no transaction. Its
			// record committed, but an earlier answer of it may have been
			// refused as not replicated: it waits for the standbys too.
			return s.replicated(ctx, res, err)
		}
		ctx = context.WithValue(ctx, requestKey{}, *c.Request)
		if s.cfg.Mode == ModeTransaction {
			leave, err := s.gate.wait(ctx, s.cfg.Store, *c.Request, s.cfg.Timeout, s.cfg.RetryAfter)
			if err != nil {
				r := c.Request
				s.cfg.Store.Report(ctx, idem.Event{Kind: idem.EventInFlight, Scope: r.Scope, Key: r.Key, Operation: r.Operation})
				return idem.Result{}, err
			}
			defer leave()
		}
		// From here the call holds its key: its work is not cancelled when
		// the client goes, so that it finishes and its result is stored for
		// the client's retry, but it is bounded.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		defer cancel()
		if c.Retry {
			ctx = idem.WithRetryHint(ctx)
		}
	}
	var res idem.Result
	var err error
	if s.cfg.Mode == ModeClaim {
		res, err = s.serveClaim(ctx, c)
	} else {
		res, err = s.serveTx(ctx, c)
	}
	return s.replicated(ctx, res, err)
}

// replicated returns Serve's answer res, err once, with
// [Config.Standbys], the standbys have the commit it rests on, or an
// error of kind [NotReplicated] past [Config.StandbyWait]. An answer that
// no committed record decided returns at once.
func (s *Server) replicated(ctx context.Context, res idem.Result, err error) (idem.Result, error) {
	if s.cfg.Standbys == 0 || !decided(err) {
		return res, err
	}
	werr := s.cfg.Store.WaitReplicatedOn(context.WithoutCancel(ctx), s.cfg.Runner, s.cfg.Standbys, s.cfg.StandbyWait)
	switch {
	case werr == nil:
		return res, err
	case errors.Is(werr, idem.ErrNotReplicated):
		return idem.Result{}, fmt.Errorf("%s: %w", s.cfg.Layer, werr)
	default:
		// The wait itself failed (the primary went, the role may not
		// read the standbys' positions): the answer stands on the
		// primary but its fate is as unknown as past the bound.
		s.cfg.Logger.ErrorContext(ctx, s.cfg.Layer+": wait for the standbys", "err", werr)
		return idem.Result{}, fmt.Errorf("%s: %w: %w", s.cfg.Layer, idem.ErrNotReplicated, werr)
	}
}

// decided reports whether err, Serve's, is an answer that a committed
// record decided: none (the call's own result, or a replay), a mismatch
// with the record, or an expired key. With Config.Standbys such an
// answer waits until that record has reached the standbys.
func decided(err error) bool {
	return err == nil || errors.Is(err, idem.ErrMismatch) || errors.Is(err, idem.ErrExpired)
}

// serveTx runs the handler inside Store.DoOn (Store.ApplyOn when the
// call's Answer is known), in a transaction the Runner begins and
// InPipelinedTx retries: on a Runner that pipelines (pgx's), its BEGIN
// goes with the claim and its COMMIT with the completion, so that DoOn
// returns before its completion is sent, and the commit's outcome is the
// call's.
func (s *Server) serveTx(ctx context.Context, c Call) (idem.Result, error) {
	var res idem.Result
	err := idem.InPipelinedTx(ctx, s.cfg.Runner, sql.LevelDefault, func(tx idem.Tx) error {
		h := &holder{runner: s.cfg.Runner, tx: tx}
		run := func(ctx context.Context) (idem.Response, error) { return c.Run(withHolder(ctx, h)) }
		var err error
		if c.Request == nil {
			res.Response, err = run(ctx)
			return err
		}
		if c.Answer != nil {
			res, err = s.cfg.Store.ApplyOn(ctx, tx, *c.Request, *c.Answer, func(ctx context.Context) error {
				_, err := run(ctx)
				return err
			})
			return err
		}
		res, err = s.cfg.Store.DoOn(ctx, tx, *c.Request, run)
		return err
	})
	if err != nil {
		return idem.Result{}, err
	}
	return res, nil
}

// serveClaim runs the handler under a claim committed by BeginOn, and
// completes the claim in the handler's transaction.
func (s *Server) serveClaim(ctx context.Context, c Call) (idem.Result, error) {
	var claim *idem.Claim
	if c.Request != nil {
		cl, replay, err := s.cfg.Store.BeginOn(ctx, s.cfg.Runner, *c.Request)
		switch {
		case err != nil:
			return idem.Result{}, err
		case replay != nil:
			return *replay, nil
		}
		claim = cl
		ctx = context.WithValue(ctx, claimKey{}, claim)
	}
	// Once the handler has run, its effects are recorded even if it used
	// up Timeout: the transaction and the release do not end with the
	// handler's context.
	detached := context.WithoutCancel(ctx)
	h := &holder{runner: s.cfg.Runner, begin: func() (idem.Tx, error) { return s.cfg.Runner.BeginTx(detached, sql.LevelDefault) }}
	finished := false
	defer func() {
		if !finished { // the handler panicked: clean up and let the panic go on
			s.abandon(detached, h, claim)
		}
	}()
	resp, err := c.Run(withHolder(ctx, h))
	finished = true
	if c.Answer != nil {
		resp = *c.Answer
	}
	if err == nil {
		err = s.complete(detached, h, claim, resp)
	}
	if err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			h.rollback(detached) // the claim is no longer this call's to release
		} else {
			s.abandon(detached, h, claim)
		}
		return idem.Result{}, err
	}
	return idem.Result{Response: resp}, nil
}

// complete stores the handler's answer with the claim in the handler's
// transaction (begun now if the handler never asked for it) and commits.
func (s *Server) complete(ctx context.Context, h *holder, claim *idem.Claim, resp idem.Response) error {
	tx, err := h.get()
	if err != nil {
		return fmt.Errorf("%s: begin the handler's transaction: %w", s.cfg.Layer, err)
	}
	if claim == nil {
		return tx.Commit(ctx)
	}
	end := idem.TrackCommitOn(tx) // the completion enters the replay cache once committed
	if err := claim.CompleteOn(ctx, tx, resp); err != nil {
		end(err)
		return err
	}
	err = tx.Commit(ctx)
	end(err)
	return err
}

// abandon rolls back the handler's transaction, if it began, and releases
// the claim, so that the client's retry runs at once.
func (s *Server) abandon(ctx context.Context, h *holder, claim *idem.Claim) {
	h.rollback(ctx)
	if claim == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := claim.ReleaseOn(ctx, s.cfg.Runner); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		s.cfg.Logger.WarnContext(ctx, s.cfg.Layer+": release the claim; it is held until its lease ends", "err", err)
	}
}
