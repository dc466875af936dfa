package bench

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// backendCPU is the CPU time a local PostgreSQL backend has used: user
// and system, from /proc/<pid>/stat, in clock ticks of 10ms.
func backendCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] { // utime, stime
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// selfCPU is the CPU time this process has used, user and system.
func selfCPU() time.Duration {
	var r syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// sideEnv names the side a child process of TestCPUPerTransaction runs:
// "driver path seconds". The child sets up its tables, says sideReady,
// waits for a line on its standard input, runs, and says sideResult.
const (
	sideEnv    = "IDEM_BENCH_SIDE"
	sideReady  = "side ready"
	sideResult = "side result:"
)

// sideWorkers is how many workers each side runs, each on a connection of
// its own: 16 in all, as TestRun's concurrency.
const sideWorkers = 8

// TestCPUPerTransaction measures the CPU time one transaction of each path
// with a floor costs the PostgreSQL backend and the client (driver,
// database/sql and idem), through each PostgreSQL driver, side by side
// with its floor: two child processes of this test, one running the path
// and one the floor, 8 workers each, over the same seconds. At 16 workers
// on a machine of few cores the server and the client share, throughput
// is bound by this CPU, so the floor's total over the path's is the ratio
// TestRun measures, without the run-to-run swings of a rate: both sides
// run under the same load from outside. It needs the server on this
// machine (it reads each backend's /proc/<pid>/stat) and runs only under
// IDEM_BENCH (IDEM_BENCH_SECONDS a side, default 10); run it with -v for
// the table (docs/benchmarks.md).
func TestCPUPerTransaction(t *testing.T) {
	if side := os.Getenv(sideEnv); side != "" {
		runSide(t, side)
		return
	}
	if os.Getenv("IDEM_BENCH") == "" {
		t.Skip("IDEM_BENCH is unset")
	}
	secs := 10
	if s, err := strconv.Atoi(os.Getenv("IDEM_BENCH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if tg.dialect.Name() != "postgres" {
			continue
		}
		t.Run(tg.driver, func(t *testing.T) {
			var out strings.Builder
			tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "path\tserver µs\tclient µs\ttotal µs\tfloor\tserver µs\tclient µs\ttotal µs\tfloor / path\t")
			for _, p := range paths {
				if p.floor == "" {
					continue
				}
				path, floor, err := sideBySide(self, fmt.Sprintf("%s %s %d", tg.driver, p.name, secs), fmt.Sprintf("%s %s %d", tg.driver, p.floor, secs))
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%.2f\t\n", p.name, path.server, path.client, path.total(),
					p.floor, floor.server, floor.client, floor.total(), floor.total()/path.total())
			}
			_ = tw.Flush()
			t.Logf("CPU per transaction, %s, %d workers a side, %ds:\n%s", tg.driver, sideWorkers, secs, out.String())
		})
	}
}

// cpu is what a side measured: CPU per transaction in µs.
type cpu struct{ server, client float64 }

func (c cpu) total() float64 { return c.server + c.client }

// sideBySide runs the sides a and b in two child processes of the test
// binary self, lets both go once both are ready, and returns what each
// measured once both have ended (and dropped their tables). A child that
// fails is killed with the other.
func sideBySide(self, a, b string) (_, _ cpu, err error) {
	type child struct {
		cmd   *osexec.Cmd
		stdin io.WriteCloser
		lines *bufio.Scanner
		out   strings.Builder
	}
	var cs [2]*child
	for i, side := range []string{a, b} {
		c := &child{cmd: osexec.Command(self, "-test.run=^TestCPUPerTransaction$", "-test.v")}
		c.cmd.Env = append(os.Environ(), sideEnv+"="+side)
		c.cmd.Stderr = os.Stderr
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			return cpu{}, cpu{}, err
		}
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			return cpu{}, cpu{}, err
		}
		if err := c.cmd.Start(); err != nil {
			return cpu{}, cpu{}, err
		}
		defer func() {
			if err != nil {
				_ = c.cmd.Process.Kill()
			}
			if werr := c.cmd.Wait(); err == nil && werr != nil {
				err = fmt.Errorf("side %q: %w:\n%s", side, werr, c.out.String())
			}
		}()
		c.lines = bufio.NewScanner(stdout)
		cs[i] = c
	}
	// until reads c's output up to the line that starts with prefix, and
	// returns the rest of that line.
	until := func(c *child, prefix string) (string, error) {
		for c.lines.Scan() {
			line := c.lines.Text()
			fmt.Fprintln(&c.out, line)
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return rest, nil
			}
		}
		return "", fmt.Errorf("a side ended before %q:\n%s", prefix, c.out.String())
	}
	for _, c := range cs {
		if _, err := until(c, sideReady); err != nil {
			return cpu{}, cpu{}, err
		}
	}
	for _, c := range cs {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return cpu{}, cpu{}, err
		}
	}
	var res [2]cpu
	for i, c := range cs {
		rest, err := until(c, sideResult)
		if err != nil {
			return cpu{}, cpu{}, err
		}
		if _, err := fmt.Sscan(rest, &res[i].server, &res[i].client); err != nil {
			return cpu{}, cpu{}, fmt.Errorf("%q: %w", rest, err)
		}
		for c.lines.Scan() { // the rest of its output, until it ends
			fmt.Fprintln(&c.out, c.lines.Text())
		}
	}
	return res[0], res[1], nil
}

// runSide runs one side of TestCPUPerTransaction in this process, as
// side says, on sideWorkers connections whose backends it watches, and
// prints its result.
func runSide(t *testing.T, side string) {
	var (
		driver, name string
		secs         int
	)
	if _, err := fmt.Sscan(side, &driver, &name, &secs); err != nil {
		t.Fatalf("%s=%q: %v", sideEnv, side, err)
	}
	ctx := context.Background()
	var tg target
	for _, c := range targets {
		if c.driver == driver {
			tg = c
		}
	}
	db := tg.open(t)
	db.SetMaxOpenConns(sideWorkers)
	db.SetMaxIdleConns(sideWorkers)
	pids, err := backends(ctx, db, sideWorkers)
	if err != nil {
		t.Fatal(err)
	}
	e := seeded(t, db, tg.dialect, sideWorkers)
	p := pathNamed(name)
	bodies := make([]func(context.Context) error, sideWorkers)
	for w := range bodies {
		bodies[w] = p.worker(e, w)
		for range 20 { // fill the statement caches
			if err := bodies[w](ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	serverCPU := func() time.Duration {
		var sum time.Duration
		for _, pid := range pids {
			d, err := backendCPU(pid)
			if err != nil {
				t.Fatal(err)
			}
			sum += d
		}
		return sum
	}
	fmt.Println(sideReady)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	server, client := serverCPU(), selfCPU()
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	var (
		done atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, body := range bodies {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := body(ctx); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	n := float64(done.Load())
	perTx := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	fmt.Printf("%s %.1f %.1f\n", sideResult, perTx(serverCPU()-server), perTx(selfCPU()-client))
}

// backends opens n connections of db at once and returns the process ids
// of their backends; db keeps them as its idle connections.
func backends(ctx context.Context, db *sql.DB, n int) ([]int, error) {
	conns := make([]*sql.Conn, n)
	pids := make([]int, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		conns[i] = c
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			return nil, err
		}
		if _, err := backendCPU(pids[i]); err != nil {
			return nil, fmt.Errorf("the server is not on this machine: %w", err)
		}
	}
	return pids, nil
}
