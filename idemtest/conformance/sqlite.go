package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// On SQLite a writer that finds the write lock taken waits busy_timeout,
// then fails with SQLITE_BUSY, which IsRetryable reports; RunTx retries
// it into a replay once the holder has committed.
func testSQLiteBusyIsRetryable(t *testing.T) {
	forDialect(t, idem.SQLite, func(t *testing.T, e *env) {
		s, o := e.store(), e.op()
		req := charge("busy", "100")
		dsn := strings.Replace(e.dsn, "busy_timeout(30000)", "busy_timeout(20)", 1)
		if dsn == e.dsn {
			t.Fatalf("no busy_timeout(30000) to shorten in %q", e.dsn)
		}
		impatient := e.openOn(dsn, 40)

		holder := e.begin(nil) // _txlock=immediate: holds the write lock from here
		_, err := s.Do(ctx, holder, req, o.fn(holder, req.Key))
		must(t, err)
		_, err = impatient.BeginTx(ctx, nil)
		if !idem.IsRetryable(err) {
			t.Fatalf("BEGIN while another transaction writes: %v, want a retryable SQLITE_BUSY", err)
		}
		if err := impatient.QueryRows("SELEC 1", nil, func(func(dest ...any) error) error { return nil }); err == nil || idem.IsRetryable(err) {
			t.Fatalf("a syntax error: %v, want an error IsRetryable rejects", err)
		}

		done := make(chan error, 1)
		var res idem.Result
		go func() {
			done <- runTx(ctx, impatient, nil, func(tx txn) error {
				var err error
				res, err = s.Do(ctx, tx, req, o.fn(tx, req.Key))
				return err
			})
		}()
		time.Sleep(100 * time.Millisecond)
		must(t, holder.Commit())
		must(t, <-done)
		if !res.Replayed || o.calls.Load() != 1 || e.count(o.biz, req.Key) != 1 {
			t.Fatalf("after the holder committed: replayed=%v, %d calls, %d business rows; want a replay, 1, 1",
				res.Replayed, o.calls.Load(), e.count(o.biz, req.Key))
		}
	})
}

// The DSN settings docs/dialects.md asks for are in force on the suite's
// SQLite connections, so the rest of the suite tests what it documents.
func testSQLiteSettings(t *testing.T) {
	forDialect(t, idem.SQLite, func(t *testing.T, e *env) {
		conn, err := e.sqlDB().Conn(context.Background())
		must(t, err)
		defer conn.Close()
		var mode string
		var timeout int
		must(t, conn.QueryRowContext(ctx, "SELECT * FROM pragma_journal_mode").Scan(&mode))
		must(t, conn.QueryRowContext(ctx, "SELECT * FROM pragma_busy_timeout").Scan(&timeout))
		if mode != "wal" || timeout <= 0 || !strings.Contains(e.dsn, "_txlock=immediate") {
			t.Fatalf("journal_mode %q, busy_timeout %d, DSN %q; want wal, positive, _txlock=immediate", mode, timeout, e.dsn)
		}
	})
}
