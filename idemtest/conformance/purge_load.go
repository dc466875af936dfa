package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// envInt reads a positive integer from the environment, or returns def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// The scopes of the seeded rows, by what Purge must do with them.
const (
	scopeExpired      = "expired"       // completed long past retention: purged
	scopeExpiredClaim = "expired-claim" // a claim whose lease ended long past retention: purged
	scopeRecent       = "recent"        // completed within retention: kept
	scopeLiveClaim    = "live-claim"    // created past retention, lease still live: kept
	scopeLive         = "live"          // written by the workers during the test: kept
)

// seed inserts n rows of scope with set-based SQL (no Do per row, the
// statement of SeedRecords): created ago before the database's now, one
// millisecond apart going back, with the given status and lease end
// relative to now. Completed rows carry a 200-byte body and a small
// header, like a typical JSON response. Where the newest layout needs
// every record's expiry (ExpiryInKey), each gets the one the Store's
// retention gives it; elsewhere none, as seedOlder.
func (e *env) seed(s *store, scope string, n int, ago, lease time.Duration, status string) {
	e.t.Helper()
	r := idemtest.Records{Scope: scope, Status: status, Ago: ago, Lease: lease}
	if e.ExpiryInKey {
		r.Retention = s.Retention()
	}
	e.seedAll(s, r, n)
}

// seedOlder is seed of records without an expiry, as the releases before
// expires_at wrote them, into a table of an earlier layout.
func (e *env) seedOlder(s *store, scope string, n int, ago, lease time.Duration, status string) {
	e.t.Helper()
	e.seedAll(s, idemtest.Records{Scope: scope, Status: status, Ago: ago, Lease: lease}, n)
}

// seedAll inserts records 0 to n of r, in chunks.
func (e *env) seedAll(s *store, r idemtest.Records, n int) {
	e.t.Helper()
	e.needFact("SeedRecords", e.SeedRecords != nil)
	const chunk = 100_000
	for from := 0; from < n; from += chunk {
		r.From, r.To = from, from+min(chunk, n-from)
		q, args := e.SeedRecords(r, s.Table())
		e.exec(q, args...)
	}
}

// scopeCount counts the records of a scope.
func (e *env) scopeCount(s *store, scope string) int {
	e.t.Helper()
	return int(e.int64("SELECT COUNT(*) FROM "+s.Table()+" WHERE scope = ?", scope))
}

// sample is one Do by a worker: when it started and how long it took.
type sample struct {
	start time.Time
	took  time.Duration
}

// load runs workers goroutines, each calling call(w, i) for i = 0, 1, ...
// until the stop it returns is called, and records when each call started
// and how long it took. stop waits for the workers and returns the samples
// of the calls that succeeded, and the failure, if any, that stopped each
// worker.
func load(workers int, call func(w, i int) error) (stop func() ([]sample, error)) {
	halt := make(chan struct{})
	var (
		wg       sync.WaitGroup
		samples  = make([][]sample, workers)
		failures = make([]error, workers)
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-halt:
					return
				default:
				}
				start := time.Now()
				if err := call(w, i); err != nil {
					failures[w] = fmt.Errorf("worker %d, request %d: %w", w, i, err)
					return
				}
				samples[w] = append(samples[w], sample{start, time.Since(start)})
			}
		})
	}
	return func() ([]sample, error) {
		close(halt)
		wg.Wait()
		return slices.Concat(samples...), errors.Join(failures...)
	}
}

// percentile returns the p-th percentile (0..100) of the durations of the
// samples that started within [from, to), and how many there were.
func percentile(samples []sample, from, to time.Time, p float64) (time.Duration, int) {
	var ds []time.Duration
	for _, s := range samples {
		if !s.start.Before(from) && s.start.Before(to) {
			ds = append(ds, s.took)
		}
	}
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p/100))], len(ds)
}

// Purge beside live traffic: 16 workers run Do continuously on fresh keys
// while IDEM_PURGERS (default 2) concurrent Purge calls delete
// IDEM_PURGE_ROWS (default 20,000) expired records in batches of
// IDEM_PURGE_BATCH (default 1,000). No worker fails, no record within
// retention and no live claim is deleted, every expired record is, and the
// purgers' counts add up. It logs the purge rate and the workers' latency
// with and without the purge running.
func testPurgeUnderLoad(t *testing.T) {
	rows := envInt(t, "IDEM_PURGE_ROWS", 20_000)
	batch := envInt(t, "IDEM_PURGE_BATCH", 1_000)
	purgers := envInt(t, "IDEM_PURGERS", 2)
	const (
		workers     = 16
		retention   = time.Hour
		recent      = 2_000
		claims      = 500
		liveClaims  = 100
		warmUp      = time.Second
		baselineFor = 2 * time.Second
	)
	forEach(t, func(t *testing.T, e *env) {
		var (
			batchesMu sync.Mutex
			batches   []sample // the purge batches, from the Observer
		)
		s, o := e.store(idem.WithRetention(retention), idem.WithObserver(idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
			if ev.Kind == idem.EventPurgeBatch {
				batchesMu.Lock()
				defer batchesMu.Unlock()
				batches = append(batches, sample{time.Now().Add(-ev.Duration), ev.Duration})
			}
		}))), e.op()

		seeded := time.Now()
		e.seed(s, scopeExpired, rows, 2*retention, -2*retention, "completed")
		e.seed(s, scopeExpiredClaim, claims, 2*retention, -2*retention+time.Minute, "processing")
		e.seed(s, scopeRecent, recent, retention/2, -retention/2, "completed")
		e.seed(s, scopeLiveClaim, liveClaims, 3*retention, time.Hour, "processing")
		t.Logf("seeded %d expired records in %v", rows+claims, time.Since(seeded).Round(time.Millisecond))
		if e.PurgeStats != "" {
			e.exec(e.PurgeStats + s.Table())
		}

		stopWorkers := load(workers, func(w, i int) error {
			req := charge(fmt.Sprintf("w%d-%d", w, i), "100")
			req.Scope = scopeLive
			_, err := o.do(s, req)
			return err
		})

		time.Sleep(warmUp)
		baseStart := time.Now()
		time.Sleep(baselineFor)
		purgeStart := time.Now()
		var (
			pwg    sync.WaitGroup
			counts = make([]int64, purgers)
			errs   = make([]error, purgers)
		)
		for p := range purgers {
			pwg.Go(func() { counts[p], errs[p] = s.Purge(ctx, e.db, batch) })
		}
		pwg.Wait()
		purgeEnd := time.Now()
		time.Sleep(baselineFor)
		afterEnd := time.Now()
		all, err := stopWorkers()
		must(t, errors.Join(append(errs, err)...))
		var purged int64
		for _, n := range counts {
			purged += n
		}
		if want := int64(rows + claims); purged != want {
			t.Errorf("purgers deleted %v records in all, want %d", counts, want)
		}
		for scope, want := range map[string]int{
			scopeExpired: 0, scopeExpiredClaim: 0, scopeRecent: recent, scopeLiveClaim: liveClaims, scopeLive: len(all),
		} {
			if got := e.scopeCount(s, scope); got != want {
				t.Errorf("scope %s: %d records after the purge, want %d", scope, got, want)
			}
		}
		runs := o.calls.Load()
		if e.RerunsFn != "" {
			t.Logf("%d executions for %d requests: %s", runs, len(all), e.RerunsFn)
			runs = int64(len(all))
		}
		if n := e.int64("SELECT COUNT(*) FROM " + o.biz); n != int64(len(all)) || n != runs {
			t.Errorf("%d business rows, %d executions, %d successful requests; want all equal", n, o.calls.Load(), len(all))
		}

		took := purgeEnd.Sub(purgeStart)
		t.Logf("purged %d records with %d purgers, batch %d, in %v: %.0f rows/s", purged, purgers, batch, took.Round(time.Millisecond), float64(purged)/took.Seconds())
		half := purgeStart.Add(took / 2)
		b50, nb := percentile(batches, purgeStart, purgeEnd, 50)
		b99, _ := percentile(batches, purgeStart, purgeEnd, 99)
		first, _ := percentile(batches, purgeStart, half, 50)
		last, _ := percentile(batches, half, purgeEnd, 50)
		t.Logf("purge batches: %d, p50 %v, p99 %v, max %v; p50 in the first half %v, in the second %v", nb, b50.Round(10*time.Microsecond), b99.Round(10*time.Microsecond),
			slices.MaxFunc(batches, func(a, b sample) int { return int(a.took - b.took) }).took.Round(10*time.Microsecond), first.Round(10*time.Microsecond), last.Round(10*time.Microsecond))
		for _, w := range []struct {
			name     string
			from, to time.Time
		}{{"before purge", baseStart, purgeStart}, {"during purge", purgeStart, purgeEnd}, {"after purge", purgeEnd, afterEnd}} {
			p50, n := percentile(all, w.from, w.to, 50)
			p99, _ := percentile(all, w.from, w.to, 99)
			d := w.to.Sub(w.from)
			t.Logf("workers %s: %6d requests in %7v (%4.0f/s), p50 %v, p99 %v", w.name, n, d.Round(time.Millisecond), float64(n)/d.Seconds(), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
		}
	})
}
