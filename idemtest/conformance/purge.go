package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// aged fills s with records on both sides of retention: n completed ones
// past it (old-1 to old-n) and a claim whose lease ended past it
// (old-dead-claim), which Purge deletes; a claim created past retention
// whose lease is still live (live-claim), one completed just within
// retention (recent) and a new one (new), which it keeps. Times are moved
// back on the database's clock.
func (e *env) aged(s *store, n int, retention time.Duration) {
	e.t.Helper()
	past := retention + time.Minute
	for i := 1; i <= n; i++ {
		k := fmt.Sprintf("old-%d", i)
		must(e.t, e.doOK(s, charge(k, "1")))
		e.age(s, k, past)
	}
	e.leaveClaim(s, charge("old-dead-claim", "1"), 0)
	e.age(s, "old-dead-claim", past)
	e.leaveClaim(s, charge("live-claim", "1"), past+time.Hour)
	e.age(s, "live-claim", past)
	must(e.t, e.doOK(s, charge("recent", "1")))
	e.age(s, "recent", retention-time.Minute)
	must(e.t, e.doOK(s, charge("new", "1")))
}

// staggered completes each key and moves it back past retention, the
// first the oldest, a minute apart, so that a purge takes them in order.
func (e *env) staggered(s *store, retention time.Duration, keys ...string) {
	e.t.Helper()
	for i, k := range keys {
		must(e.t, e.doOK(s, charge(k, "1")))
		e.age(s, k, retention+time.Duration(len(keys)-i)*time.Minute)
	}
}

// holdRecord locks the record of scope and key in a transaction begun with
// opts and returns it, for the test to end (the cleanup rolls it back).
func (e *env) holdRecord(s *store, opts *sql.TxOptions, scope, key string) txn {
	e.t.Helper()
	tx := e.begin(opts)
	if _, err := tx.ExecContext(ctx, e.rebind("UPDATE "+s.Table()+" SET fingerprint = fingerprint WHERE scope = ? AND idem_key = ?"), scope, key); err != nil {
		e.t.Fatalf("lock the record of %s in %s: %v", key, scope, err)
	}
	return tx
}

// Purge deletes what is past retention, in batches, and nothing else: not
// a record within retention, not a live claim.
func testPurge(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention))
		e.aged(s, 5, retention)

		if _, err := s.Purge(ctx, e.db, 0); err == nil {
			t.Fatalf("Purge with batch 0: no error")
		}
		n, err := s.Purge(ctx, e.db, 2)
		must(t, err)
		if n != 6 {
			t.Fatalf("purged %d records, want 6", n)
		}
		for key, want := range map[string]int{"old-1": 0, "old-dead-claim": 0, "live-claim": 1, "recent": 1, "new": 1} {
			if got := e.records(s, key); got != want {
				t.Errorf("%s: %d records after purge, want %d", key, got, want)
			}
		}
		if err := e.doOK(s, charge("live-claim", "1")); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("live claim after purge: %v, want ErrInFlight", err)
		}
	})
}

// Stats counts what Purge will delete, and Inspect reports each record as
// Do and Purge see it: past retention (forgotten) or not, its status and
// its response.
func testInspectAndStatsAgreeWithPurge(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention))
		e.aged(s, 3, retention)

		st, err := s.Stats(ctx, e.db)
		must(t, err)
		if st.Total != 7 || st.Expired != 4 || st.ByStatus[idem.StatusCompleted] != 5 || st.ByStatus[idem.StatusProcessing] != 2 {
			t.Fatalf("Stats: %+v; want 7 records, 5 completed, 2 processing, 4 past retention", st)
		}
		if age, past := st.Now.Sub(st.Oldest), retention+time.Minute; age < past || age > past+time.Minute {
			t.Errorf("Stats: the oldest record is %v old, want about %v", age, past)
		}
		for key, want := range map[string]struct {
			status    idem.Status
			forgotten bool
		}{
			"old-1":          {idem.StatusCompleted, true},
			"old-dead-claim": {idem.StatusProcessing, true},
			"live-claim":     {idem.StatusProcessing, false},
			"new":            {idem.StatusCompleted, false},
		} {
			r, err := s.Inspect(ctx, e.db, "tenant-1", key)
			must(t, err)
			if r == nil || r.Status != want.status || r.Forgotten != want.forgotten || (r.Response != nil) != (want.status == idem.StatusCompleted) {
				t.Errorf("Inspect %s: %+v; want status %s, forgotten %v", key, r, want.status, want.forgotten)
			}
		}

		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != st.Expired {
			t.Fatalf("Purge deleted %d records; Stats counted %d past retention", n, st.Expired)
		}
		if r, err := s.Inspect(ctx, e.db, "tenant-1", "old-1"); err != nil || r != nil {
			t.Fatalf("Inspect of a purged key: %+v, %v; want nil, nil", r, err)
		}
		st, err = s.Stats(ctx, e.db)
		must(t, err)
		if st.Total != 3 || st.Expired != 0 {
			t.Fatalf("Stats after the purge: %+v; want 3 records, none past retention", st)
		}
	})
}

// Each purge batch starts where the Store's previous batch ended, so that
// it does not walk again the rows earlier batches deleted; a record the
// batches passed over is purged by the next sweep, which starts from the
// oldest record after a batch that came back short.
func testPurgeSweeps(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention))
		e.leaveClaim(s, charge("passed-over", "1"), 2*retention)
		e.age(s, "passed-over", retention+10*time.Minute) // the oldest, its lease live
		e.staggered(s, retention, "old-1", "old-2", "old-3", "old-4")
		batch := func(want int64, gone ...string) {
			t.Helper()
			n, err := s.PurgeBatch(ctx, e.db, 2)
			must(t, err)
			if n != want {
				t.Fatalf("batch purged %d records, want %d", n, want)
			}
			for _, k := range gone {
				if e.records(s, k) != 0 {
					t.Fatalf("%s is still there after its batch", k)
				}
			}
		}
		batch(2, "old-1", "old-2")
		e.setLease(s, "passed-over", -retention-time.Minute) // now past retention, behind the cursor
		batch(2, "old-3", "old-4")
		if e.records(s, "passed-over") != 1 {
			t.Fatalf("a batch went back for a record behind the cursor: the cursor was not kept")
		}
		batch(0) // the end of the sweep
		batch(1, "passed-over")
		batch(0)
	})
}

// A sweep takes every record past its expiry, full batch after full
// batch, however unevenly their expiries lie: four a second apart, then
// none for ten hours, then four an hour apart. Where a window reads only
// a span past the cursor, learnt from the batch before (TiDB's), the
// window after the dense four finds nothing in its span and must read on
// past the gap instead of ending the sweep, and the first window past it
// must not carry the dense records' span into the sparse ones.
func testPurgeAcrossGaps(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention))
		var keys []string
		for i := range 4 {
			k := fmt.Sprintf("dense-%d", i)
			must(t, e.doOK(s, charge(k, "1")))
			e.age(s, k, retention+11*time.Hour-time.Duration(i)*time.Second)
			keys = append(keys, k)
		}
		for i := range 4 {
			k := fmt.Sprintf("sparse-%d", i)
			must(t, e.doOK(s, charge(k, "1")))
			e.age(s, k, retention+time.Duration(4-i)*time.Hour)
			keys = append(keys, k)
		}
		must(t, e.doOK(s, charge("new", "1")))
		for i := 0; i < len(keys); i += 2 {
			n, err := s.PurgeBatch(ctx, e.db, 2)
			must(t, err)
			if n != 2 {
				t.Fatalf("batch %d purged %d records, want 2: %d of %d past their expiry are left", i/2+1, n, e.countLeft(s, keys), len(keys))
			}
		}
		n, err := s.PurgeBatch(ctx, e.db, 2)
		must(t, err)
		if n != 0 || e.countLeft(s, keys) != 0 || e.records(s, "new") != 1 {
			t.Fatalf("after the sweep: a batch purged %d, %d records past their expiry left, %d of the new one; want 0, 0 and 1", n, e.countLeft(s, keys), e.records(s, "new"))
		}
	})
}

// countLeft counts the records of keys still in s.
func (e *env) countLeft(s *store, keys []string) int {
	e.t.Helper()
	n := 0
	for _, k := range keys {
		n += e.records(s, k)
	}
	return n
}

// Batches of one Store that run at once delete consecutive windows: a
// batch does not wait for the rows of the batch that started before it. A
// transaction holds the oldest record, so the first batch waits for it
// (TiDB) or passes it over (SkipsLocked: PostgreSQL's and MySQL's SKIP
// LOCKED); a second batch started meanwhile deletes the next window at
// once.
func testPurgeBatchesRunTogether(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e = e.onOneNode()
		if e.OneWriter {
			t.Skipf("%s has one writer: batches run one after another, by design", e.Name)
		}
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention))
		keys := []string{"old-1", "old-2", "old-3", "old-4"}
		e.staggered(s, retention, keys...)
		hold := e.holdRecord(s, nil, "tenant-1", "old-1")
		type result struct {
			n   int64
			err error
		}
		first := make(chan result, 1)
		go func() {
			n, err := s.PurgeBatch(ctx, e.db, 2)
			first <- result{n, err}
		}()
		var one result
		if e.SkipsLocked {
			one = <-first
			must(t, one.err)
		} else {
			// The first batch's DELETE itself, not any statement on the
			// table: its window read must be over before the second batch
			// starts.
			for deadline := time.Now().Add(10 * time.Second); e.onEveryNode(e.WaitingQuery, "DELETE%"+s.Table()+"%") == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the first batch's DELETE did not start within 10s")
				}
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		two, err := s.PurgeBatch(cctx, e.db, 2)
		if err != nil {
			t.Fatalf("a second batch, while the first waited for a row: %v; it waited for the first batch's window", err)
		}
		must(t, hold.Rollback())
		if !e.SkipsLocked {
			one = <-first
			must(t, one.err)
			if one.n != 2 || two != 2 {
				t.Errorf("batches deleted %d and %d records, want 2 and 2 (one window each)", one.n, two)
			}
		}
		rest, err := s.Purge(ctx, e.db, 2)
		must(t, err)
		if total := one.n + two + rest; total != int64(len(keys)) {
			t.Errorf("purged %d records in all (%d, %d, then %d), want %d", total, one.n, two, rest, len(keys))
		}
		for _, k := range keys {
			if e.records(s, k) != 0 {
				t.Errorf("%s is still there after the purge", k)
			}
		}
	})
}

// A purge batch does not hold up fresh claims while it runs. A batch deletes
// a range of the primary key's oldest rows; under REPEATABLE READ InnoDB
// would also lock the gap before the first row past its window, where
// fresh claims go. Purge runs at READ COMMITTED, which takes no gap locks,
// so claims still go into that gap. The only record newer than the window
// is a live claim created ahead of the clock (as after a failover to a
// server whose clock is behind), held by a transaction, so fresh claims
// sort just before it. Ten claims run beside the batch; each must finish
// within 5 s.
func testPurgeBatchDoesNotBlockClaims(t *testing.T) {
	const (
		rows   = 100_000
		claims = 10
		wait   = 5 * time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		e = e.onOneNode()
		if e.OneWriter {
			t.Skipf("%s has one writer: a purge batch holds up every claim for its duration, by design", e.Name)
		}
		if e.HeavyWrites != "" {
			t.Skip(e.HeavyWrites)
		}
		s := e.store(idem.WithRetention(time.Hour))
		e.seed(s, scopeExpired, rows, 2*time.Hour, -2*time.Hour, "completed")
		e.seed(s, "ahead", 1, -24*time.Hour, 48*time.Hour, "processing")
		hold := e.holdRecord(s, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, "ahead", "k-0")

		var (
			n        int64
			purgeErr error
			purging  = make(chan struct{})
		)
		start := time.Now()
		go func() {
			defer close(purging)
			n, purgeErr = s.Purge(ctx, e.db, 2*rows)
		}()
		var slowest time.Duration
		for i := range claims {
			cctx, cancel := context.WithTimeout(ctx, wait)
			began := time.Now()
			err := runTx(cctx, e.db, nil, func(tx txn) error {
				_, err := s.Do(cctx, tx, charge(fmt.Sprintf("fresh-%d", i), "1"), ok)
				return err
			})
			cancel()
			slowest = max(slowest, time.Since(began))
			if err != nil {
				must(t, hold.Rollback())
				<-purging
				t.Fatalf("fresh claim %d, %v into a purge batch: %v; it waited for the batch", i, began.Sub(start).Round(time.Millisecond), err)
			}
		}
		must(t, hold.Rollback())
		<-purging
		must(t, purgeErr)
		if n != rows {
			t.Fatalf("purged %d, want %d", n, rows)
		}
		t.Logf("%d fresh claims beside a purge of %d rows (%v), the slowest %v", claims, rows, time.Since(start), slowest)
	})
}
