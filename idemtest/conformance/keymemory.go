package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// A record keeps the key memory it was completed with, whoever purges:
// a Store without key memory (another service on the table, a tool's
// purge) neither forgets the key nor deletes the record before its forget
// time, whether the memory came from the completing Store or from the
// request (Do's, Begin's and Apply's completions alike). A retry before
// then is refused (ErrExpired) and its fn does not run, before and after
// that purge; after the forget time the plain Store's purge deletes the
// tombstones. It failed before the forget time was stored: the plain
// Store's purge deleted the records and the retries ran again.
func testKeyMemoryKeptByTheRecord(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		remembering := e.store(idem.WithRetention(retention), idem.WithKeyMemory(24*time.Hour))
		plain := e.elsewhere(remembering, idem.WithRetention(retention))
		o := e.op()
		byStore := charge("by-store", "1")
		byRequest := charge("by-request", "1")
		byRequest.KeyMemory = 24 * time.Hour
		applied := charge("applied", "1")
		applied.KeyMemory = 24 * time.Hour
		begun := charge("begun", "1")
		begun.KeyMemory = 24 * time.Hour
		_, err := o.do(remembering, byStore)
		must(t, err)
		_, err = o.do(plain, byRequest)
		must(t, err)
		_, err = o.apply(plain, applied)
		must(t, err)
		c, _, err := plain.Begin(ctx, e.db, begun)
		must(t, err)
		tx := e.begin(nil)
		must(t, c.Complete(ctx, tx, idem.Response{StatusCode: 201}))
		must(t, tx.Commit())
		reqs := []idem.Request{byStore, byRequest, applied, begun}
		for _, r := range reqs {
			e.age(remembering, r.Key, 2*retention)
		}
		calls := o.calls.Load()
		refused := func(when string) {
			t.Helper()
			for _, r := range reqs {
				for name, s := range map[string]*store{"the plain Store": plain, "the remembering Store": remembering} {
					if _, err := o.do(s, r); !errors.Is(err, idem.ErrExpired) {
						t.Fatalf("%s: a retry of %s through %s: %v, want ErrExpired", when, r.Key, name, err)
					}
				}
				if _, _, err := plain.Begin(ctx, e.db, r); !errors.Is(err, idem.ErrExpired) {
					t.Fatalf("%s: Begin of %s through the plain Store: %v, want ErrExpired", when, r.Key, err)
				}
			}
			if got := o.calls.Load(); got != calls {
				t.Fatalf("%s: fn ran %d times more, want none", when, got-calls)
			}
		}
		refused("past retention")
		n, err := plain.Purge(ctx, e.db, 1)
		must(t, err)
		if n != int64(len(reqs)) {
			t.Errorf("the plain Store's purge past retention changed %d records, want %d tombstones", n, len(reqs))
		}
		for _, r := range reqs {
			if got := e.int64("SELECT COUNT(*) FROM "+plain.Table()+" WHERE idem_key = ? AND status = 'expired' AND response_body IS NULL", r.Key); got != 1 {
				t.Fatalf("%s after the plain Store's purge: %d tombstones, want 1", r.Key, got)
			}
		}
		refused("after the plain Store's purge")
		for _, r := range reqs {
			e.age(remembering, r.Key, 24*time.Hour)
		}
		n, err = plain.Purge(ctx, e.db, 1)
		must(t, err)
		for _, r := range reqs {
			if e.records(plain, r.Key) != 0 {
				t.Errorf("%s is still there past its forget time", r.Key)
			}
		}
		if n != int64(len(reqs)) {
			t.Errorf("the purge past the forget time deleted %d, want %d", n, len(reqs))
		}
		if res, err := o.do(plain, byStore); err != nil || res.Replayed {
			t.Fatalf("past the forget time: %+v, %v; want a fresh run", res, err)
		}
	})
}

// A record that a purge first meets after its forget time has passed is
// deleted, not made a tombstone kept for another key memory: a key
// memory Store's first purge of a backlog shrinks the table. It failed
// before: the purge stripped every such record and kept it.
func testPurgeDeletesABacklogPastItsForgetTime(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention), idem.WithKeyMemory(24*time.Hour))
		var keys []string
		for i := range 3 {
			k := fmt.Sprintf("backlog-%d", i)
			keys = append(keys, k)
			must(t, e.doOK(s, charge(k, "1")))
			e.age(s, k, retention+25*time.Hour)
		}
		must(t, e.doOK(s, charge("remembered", "1")))
		e.age(s, "remembered", 2*retention)
		n, err := s.Purge(ctx, e.db, 2)
		must(t, err)
		for _, k := range keys {
			if e.records(s, k) != 0 {
				t.Errorf("%s, past its forget time, is still there after the purge", k)
			}
		}
		if got := e.int64("SELECT COUNT(*) FROM " + s.Table() + " WHERE idem_key = 'remembered' AND status = 'expired'"); got != 1 {
			t.Errorf("the record within its key memory: %d tombstones, want 1", got)
		}
		if n != int64(len(keys))+1 {
			t.Errorf("purged %d records, want %d", n, len(keys)+1)
		}
	})
}

// A record written before the schema version with forget times (its
// forget_at NULL, as an earlier release wrote it) keeps the key memory of
// the Store that reads or purges it, as it did. So does one whose forget
// time is earlier than its expiry, as a release before, running beside,
// leaves a record it took over and completed: that forget time is the
// one before the takeover, and the record still replays within its
// retention.
func testKeyMemoryOfEarlierRecords(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		const retention = time.Hour
		s := e.store(idem.WithRetention(retention), idem.WithKeyMemory(24*time.Hour))
		plain := e.elsewhere(s, idem.WithRetention(retention))
		req := charge("earlier", "1")
		must(t, e.doOK(s, req))
		e.exec("UPDATE "+s.Table()+" SET forget_at = NULL WHERE idem_key = ?", req.Key)
		e.age(s, req.Key, 2*retention)
		if _, err := e.do(s, req, func(handle) func(context.Context) (idem.Response, error) { return ok }); !errors.Is(err, idem.ErrExpired) {
			t.Fatalf("through the Store with key memory: %v, want ErrExpired", err)
		}
		n, err := s.Purge(ctx, e.db, 10)
		must(t, err)
		if n != 1 || e.records(s, req.Key) != 1 {
			t.Fatalf("the key memory Store's purge: %d, %d records; want a tombstone", n, e.records(s, req.Key))
		}
		must(t, e.doOK(s, charge("earlier-plain", "1")))
		e.exec("UPDATE "+s.Table()+" SET forget_at = NULL WHERE idem_key = ?", "earlier-plain")
		e.age(s, "earlier-plain", 2*retention)
		if res, err := e.do(plain, charge("earlier-plain", "2"), func(handle) func(context.Context) (idem.Response, error) { return ok }); err != nil || res.Replayed {
			t.Fatalf("through the Store without key memory: %+v, %v; want the key forgotten, as before", res, err)
		}
		retaken := charge("retaken", "1")
		must(t, e.doOK(plain, retaken))
		e.exec("UPDATE "+s.Table()+" SET forget_at = "+e.PlusMicros("expires_at")+" WHERE idem_key = ?", (-2 * retention).Microseconds(), retaken.Key)
		if res, err := e.do(plain, retaken, func(handle) func(context.Context) (idem.Response, error) { return ok }); err != nil || !res.Replayed {
			t.Fatalf("within retention, with a forget time before its expiry: %+v, %v; want a replay", res, err)
		}
		n, err = plain.Purge(ctx, e.db, 10)
		must(t, err)
		if e.records(s, retaken.Key) != 1 {
			t.Fatalf("the purge deleted a record within its retention, whose forget time was before its expiry (%d purged)", n)
		}
	})
}

// Purge never spins on rows another transaction holds, whatever its
// batch size: a transaction holds the oldest due record (one kept by a
// key memory, which the batch would make a tombstone) while Purge runs
// with batches of 1, 2 and 100 beside other due records; each Purge ends
// within seconds, with every other due record gone and the held one
// still there, and a Purge after the holder ends makes it a tombstone.
// It failed before on PostgreSQL: the held row filled every batch of 1,
// 0 rows went, and the batch counted as full for ever; on MariaDB
// batches of 1 and 2 waited on the lock until it was released.
func testPurgePassesOverHeldRows(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if !e.SkipsLocked {
			t.Skipf("%s's purge waits for a held row instead of passing it over (oneWriter: %v)", e.Name, e.OneWriter)
		}
		const retention = time.Hour
		for _, batch := range []int{1, 2, 100} {
			s := e.store(idem.WithRetention(retention))
			held := charge("held", "1")
			held.KeyMemory = 24 * time.Hour
			must(t, e.doOK(s, held))
			e.age(s, held.Key, retention+time.Hour)
			var keys []string
			for i := range 5 {
				k := fmt.Sprintf("due-%d", i)
				keys = append(keys, k)
				must(t, e.doOK(s, charge(k, "1")))
				e.age(s, k, retention+time.Minute)
			}
			hold := e.holdRecord(s, nil, held.Scope, held.Key)
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			n, err := s.Purge(cctx, e.db, batch)
			cancel()
			if err != nil {
				t.Fatalf("Purge with batch %d beside a held row: %v after %v (%d purged)", batch, err, time.Since(start), n)
			}
			if n != int64(len(keys)) {
				t.Errorf("Purge with batch %d purged %d, want %d", batch, n, len(keys))
			}
			for _, k := range keys {
				if e.records(s, k) != 0 {
					t.Errorf("batch %d: %s is still there", batch, k)
				}
			}
			if e.records(s, held.Key) != 1 {
				t.Fatalf("batch %d: the held record is gone", batch)
			}
			t.Logf("batch %d: purged %d beside a held row in %v", batch, n, time.Since(start).Round(time.Millisecond))
			must(t, hold.Rollback())
			n, err = s.Purge(ctx, e.db, batch)
			must(t, err)
			if n != 1 || e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE idem_key = ? AND status = 'expired'", held.Key) != 1 {
				t.Errorf("batch %d: once released, the held record: %d purged; want it made a tombstone", batch, n)
			}
		}
	})
}
