//go:build linux

package failover_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/idemtest/testdb"
)

// A PostgreSQL 15 primary and a streaming standby of this test's own, on
// free loopback ports, in temporary data directories: the standby
// streams through a TCP proxy (link), which the test resets when it
// kills the primary, as a dead host's connection would be; clients reach
// "the primary" through another (front), which the test points at the
// promoted standby after the failover, as a virtual IP or Patroni's
// endpoint would be.

// pgBin is where PostgreSQL's server binaries are: IDEM_TEST_PG_BIN, else
// Debian's PostgreSQL 15, else the newest other major version Debian's
// packages installed (12 or later: pg_promote).
func pgBin() string {
	if d := os.Getenv("IDEM_TEST_PG_BIN"); d != "" {
		return d
	}
	const debian = "/usr/lib/postgresql/15/bin"
	if _, err := os.Stat(debian); err == nil {
		return debian
	}
	newest, major := debian, 11
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range dirs {
		if v, err := strconv.Atoi(filepath.Base(filepath.Dir(d))); err == nil && v > major {
			newest, major = d, v
		}
	}
	return newest
}

// pgOwner is whom the servers run as: the postgres OS user when this
// process is root (initdb and postgres refuse root), else nil (this
// process's user).
type pgOwner struct{ uid, gid uint32 }

// needServer skips tb, or fails it under IDEM_TEST_REQUIRE=1, when the
// binaries are missing or, as root, there is no postgres user to run
// them as; it returns that user (nil when not root).
func needServer(tb testing.TB) *pgOwner {
	tb.Helper()
	missing := func(why string) {
		why = "github.com/idemkit/idem/integration_test/failover: " + why
		if testdb.Required {
			tb.Fatalf("IDEM_TEST_REQUIRE=1 and %s", why)
		}
		tb.Skip(why)
	}
	for _, b := range []string{"initdb", "postgres", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(pgBin(), b)); err != nil {
			missing(fmt.Sprintf("PostgreSQL's %s is not in %s (install postgresql-15, or set IDEM_TEST_PG_BIN to the directory of initdb, postgres and pg_basebackup)", b, pgBin()))
		}
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		missing("running as root, which initdb and postgres refuse, and there is no postgres user to run them as: " + err.Error())
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &pgOwner{uid: uint32(uid), gid: uint32(gid)}
}

// command is a PostgreSQL binary run as o, in a process group of its own
// (so that every process of a server can be killed at once). The test
// is Linux's: Pdeathsig, and the System V call of stop.
func (o *pgOwner) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(pgBin(), name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	// Pdeathsig: a postmaster outlives no test binary that a timeout
	// killed, and its backends follow it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if o != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: o.uid, Gid: o.gid}
	}
	return cmd
}

// run runs a binary to its end, failing tb with its output.
func (o *pgOwner) run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := o.command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// mkdir makes a directory that o owns.
func (o *pgOwner) mkdir(tb testing.TB, dir string) {
	tb.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if o != nil {
		if err := os.Chown(dir, int(o.uid), int(o.gid)); err != nil {
			tb.Fatal(err)
		}
	}
}

// template is an initdb'd data directory, made once per test binary and
// copied for each primary: initdb is most of a cluster's start-up.
type template struct {
	owner *pgOwner
	base  string // a directory owner owns, removed when the tests end (TestMain)
	data  string
}

// templates is the test binary's template, made by the first test that
// needs one.
var templates struct {
	once sync.Once
	tpl  *template
	err  error
}

// newTemplate returns the test binary's template, making it the first
// time: it skips or fails tb, as needServer says, when there are no
// binaries to make it with.
func newTemplate(tb testing.TB) *template {
	tb.Helper()
	o := needServer(tb)
	templates.once.Do(func() {
		base, err := os.MkdirTemp("", "idem-failover-")
		if err != nil {
			templates.err = err
			return
		}
		tpl := &template{owner: o, base: base, data: filepath.Join(base, "template")}
		templates.tpl = tpl
		if o != nil {
			if err := os.Chown(base, int(o.uid), int(o.gid)); err != nil {
				templates.err = err
				return
			}
		}
		cmd := o.command("initdb", "-D", tpl.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
		if out, err := cmd.CombinedOutput(); err != nil {
			templates.err = fmt.Errorf("initdb: %v\n%s", err, out)
		}
	})
	if templates.err != nil {
		tb.Fatal(templates.err)
	}
	return templates.tpl
}

// removeTemplate removes the template's directory and every server's
// data under it, once the tests have ended.
func removeTemplate() {
	if templates.tpl != nil {
		_ = os.RemoveAll(templates.tpl.base)
	}
}

// server is one postgres server of the test's.
type server struct {
	t    testing.TB
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the postmaster has exited
}

// addr is the server's TCP address.
func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// dsn is a DSN of the server's database postgres, through addr.
func dsn(addr string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5"
}

// freePort is a TCP port free on the loopback now.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start starts postgres on dir, with settings on top of its own, and
// waits until it accepts connections; it is stopped when the test ends.
func (tpl *template) start(tb testing.TB, dir string, settings ...string) *server {
	tb.Helper()
	s := &server{t: tb, dir: dir, port: freePort(tb), done: make(chan struct{})}
	args := []string{"-D", dir, "-p", strconv.Itoa(s.port)}
	for _, kv := range append([]string{
		"listen_addresses=127.0.0.1", "unix_socket_directories=" + dir,
		"fsync=off", "shared_buffers=16MB", "max_connections=60", "dynamic_shared_memory_type=mmap",
		"wal_level=replica", "max_wal_senders=4", "wal_keep_size=64MB", "logging_collector=off",
	}, settings...) {
		args = append(args, "-c", kv)
	}
	s.cmd = tpl.owner.command("postgres", args...)
	log, err := os.Create(dir + ".log")
	if err != nil {
		tb.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("postgres: %v", err)
	}
	go func() {
		_ = s.cmd.Wait()
		_ = log.Close()
		close(s.done)
	}()
	tb.Cleanup(s.stop)
	db := s.open(tb)
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := db.Ping()
		if err == nil {
			break
		}
		select {
		case <-s.done:
			out, _ := os.ReadFile(dir + ".log")
			tb.Fatalf("postgres on %s exited:\n%s", dir, out)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("postgres on %s does not answer: %v", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// open opens a pool on the server, closed when the test ends.
func (s *server) open(tb testing.TB) *sql.DB {
	db, err := sql.Open("pgx", dsn(s.addr()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// kill kills every process of the server at once (SIGKILL to its
// process group), as a host's death would, runs alongside at that
// moment (the cut of its links, with what they still held), and waits
// for the postmaster.
func (s *server) kill(alongside ...func()) {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	for _, f := range alongside {
		f()
	}
	<-s.done
}

// stop shuts the server down at once (SIGQUIT, which removes its shared
// memory), or kills it when it lingers, and removes the shared memory
// segment a killed server leaves behind.
func (s *server) stop() {
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			s.kill()
		}
	}
	// postmaster.pid's 7th line is the key and id of the server's System V
	// shared memory segment, which a SIGKILL leaves behind.
	if b, err := os.ReadFile(filepath.Join(s.dir, "postmaster.pid")); err == nil {
		if lines := strings.Split(string(b), "\n"); len(lines) > 6 {
			if f := strings.Fields(lines[6]); len(f) == 2 {
				if id, err := strconv.Atoi(f[1]); err == nil {
					_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), 0 /* IPC_RMID */, 0)
				}
			}
		}
	}
}

// clusters numbers the clusters, whose directories are named after it.
var clusters atomic.Int64

// startPrimary starts a primary, with settings, on a copy of the
// template named after name.
func (tpl *template) startPrimary(tb testing.TB, name string, settings ...string) *server {
	tb.Helper()
	dir := filepath.Join(tpl.base, fmt.Sprintf("%s-%d-primary", name, clusters.Add(1)))
	tb.Cleanup(func() { _ = os.RemoveAll(dir) }) // after the server's stop
	if out, err := exec.Command("cp", "-a", tpl.data, dir).CombinedOutput(); err != nil {
		tb.Fatalf("cp: %v\n%s", err, out)
	}
	return tpl.start(tb, dir, settings...)
}

// cluster is a primary with a streaming standby behind the link proxy,
// and the front proxy the clients go through.
type cluster struct {
	primary, standby *server
	link, front      *proxy
}

// startCluster starts a primary (with settings) and, once schema has run
// on it, a standby streaming through a link that delays each chunk by
// delay, one way; it waits until the standby streams.
func (tpl *template) startCluster(tb testing.TB, name string, delay time.Duration, schema func(db *sql.DB) error, settings ...string) *cluster {
	tb.Helper()
	c := &cluster{primary: tpl.startPrimary(tb, name, settings...)}
	sdir := strings.TrimSuffix(c.primary.dir, "-primary") + "-standby"
	tb.Cleanup(func() { _ = os.RemoveAll(sdir) })
	if err := schema(c.primary.open(tb)); err != nil {
		tb.Fatalf("schema: %v", err)
	}
	c.link = startProxy(tb, c.primary.addr(), delay)
	port := strconv.Itoa(c.link.port())
	tpl.owner.run(tb, "pg_basebackup", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-D", sdir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	c.standby = tpl.start(tb, sdir, "hot_standby=on", "wal_receiver_status_interval=1s", "wal_retrieve_retry_interval=100ms")
	pdb := c.primary.open(tb)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := pdb.QueryRow(`SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n); err != nil {
			tb.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("the standby does not stream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.front = startProxy(tb, c.primary.addr(), 0)
	return c
}

// synchronous makes the primary's commits wait for the standby's flush.
func (c *cluster) synchronous(tb testing.TB) {
	tb.Helper()
	db := c.primary.open(tb)
	for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`} {
		if _, err := db.Exec(q); err != nil {
			tb.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n); err != nil {
			tb.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("the standby does not become synchronous")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// promote promotes the standby once the primary is dead, and points the
// front proxy at it; it returns how long the promotion took.
func (c *cluster) promote(tb testing.TB) time.Duration {
	tb.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var promoted bool
	if err := c.standby.open(tb).QueryRowContext(ctx, `SELECT pg_promote(true, 60)`).Scan(&promoted); err != nil || !promoted {
		tb.Fatalf("pg_promote: %v, %v", promoted, err)
	}
	took := time.Since(start)
	c.front.retarget(c.standby.addr())
	return took
}
