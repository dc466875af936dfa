package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Waiting for standbys is PostgreSQL's: every other dialect refuses it
// before any statement, naming its own way, and the arguments are
// checked.
func TestWaitReplicatedRefused(t *testing.T) {
	for _, c := range []struct {
		d    idem.Dialect
		want string
	}{
		{idem.MySQL, "rpl_semi_sync_master_enabled"},
		{idem.MariaDB, "rpl_semi_sync_master_enabled"},
		{idem.TiDB, "Raft"},
		{idem.SQLite, "no standbys"},
	} {
		s, err := idem.New(c.d)
		if err != nil {
			t.Fatal(err)
		}
		err = s.CheckWaitReplicated()
		if err == nil || !strings.Contains(err.Error(), "not supported on "+c.d.Name()) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: CheckWaitReplicated = %v, want not supported, naming %q", c.d.Name(), err, c.want)
		}
		if err := s.WaitReplicated(context.Background(), new(sql.DB), 1, time.Second); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("%s: WaitReplicated = %v, want not supported", c.d.Name(), err)
		}
	}
	s, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckWaitReplicated(); err != nil {
		t.Errorf("postgres: CheckWaitReplicated = %v", err)
	}
	for _, c := range []struct {
		db       *sql.DB
		standbys int
		within   time.Duration
		want     string
	}{
		{nil, 1, time.Second, "got nil"},
		{new(sql.DB), 0, time.Second, "at least 1 standby"},
		{new(sql.DB), 1, 0, "positive bound"},
	} {
		if err := s.WaitReplicated(context.Background(), c.db, c.standbys, c.within); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("WaitReplicated(%v, %d, %v) = %v, want %q", c.db, c.standbys, c.within, err, c.want)
		}
	}
}

// WaitReplicatedOn refuses a transaction: what it waits for is what
// committed before it, and its reads run on a goroutine of their own.
func TestWaitReplicatedRefusesTx(t *testing.T) {
	s, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := idem.NewSQLRunner(db, nil).BeginTx(context.Background(), sql.LevelDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := s.WaitReplicatedOn(context.Background(), tx, 1, time.Second); err == nil || !strings.Contains(err.Error(), "got a transaction") {
		t.Errorf("WaitReplicatedOn(a Tx) = %v, want a refusal", err)
	}
}

// A NotReplicatedError is ErrNotReplicated, says where the wait stood,
// and unwraps to its context's error.
func TestNotReplicatedError(t *testing.T) {
	err := error(&idem.NotReplicatedError{Position: "0/3000148", Reached: 0, Want: 1, Waited: 2 * time.Second, Err: context.DeadlineExceeded})
	if !errors.Is(err, idem.ErrNotReplicated) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v: not ErrNotReplicated and DeadlineExceeded", err)
	}
	for _, want := range []string{"retry with the same key", "0/3000148", "0 of 1 standbys", "2s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if idem.IsRetryable(err) {
		t.Errorf("%v: IsRetryable, but the transaction committed: rerunning it is the client's retry with its key, not RunTx's", err)
	}
}
