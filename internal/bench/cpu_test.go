package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// TestCPUPerTransaction measures the CPU time one transaction of each path
// costs the PostgreSQL backend and this process (driver, database/sql and
// idem), through each driver on one connection. At 16 workers on a
// machine of few cores the server and the client share, throughput is
// bound by this, not by round trips, so it explains the ratios of TestRun
// and does not depend on other load. It needs the server on this machine
// (it reads the backend's /proc/<pid>/stat) and runs only under
// IDEM_BENCH; run it with -v for the table (docs/benchmarks.md).
func TestCPUPerTransaction(t *testing.T) {
	if os.Getenv("IDEM_BENCH") == "" {
		t.Skip("IDEM_BENCH is unset")
	}
	ctx := context.Background()
	for _, tg := range targets {
		if tg.dialect.Name() != "postgres" {
			continue
		}
		t.Run(tg.driver, func(t *testing.T) {
			db := tg.open(t)
			db.SetMaxOpenConns(1)
			e := seeded(t, db, tg.dialect, 1)
			var pid int
			if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if _, err := backendCPU(pid); err != nil {
				t.Skipf("the server is not on this machine: %v", err)
			}
			var out strings.Builder
			tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "path\tserver µs\tclient µs\ttotal µs\t")
			const warm, ops = 200, 3000
			for _, p := range paths {
				if p.hot {
					continue
				}
				body := p.worker(e, 0)
				for range warm {
					if err := body(ctx); err != nil {
						t.Fatal(err)
					}
				}
				server, err := backendCPU(pid)
				if err != nil {
					t.Fatal(err)
				}
				client := selfCPU()
				for range ops {
					if err := body(ctx); err != nil {
						t.Fatal(err)
					}
				}
				s, err := backendCPU(pid)
				if err != nil {
					t.Fatal(err)
				}
				server, client = s-server, selfCPU()-client
				us := func(d time.Duration) float64 { return float64(d.Microseconds()) / ops }
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t\n", p.name, us(server), us(client), us(server+client))
			}
			_ = tw.Flush()
			t.Logf("CPU per transaction, %s, one connection, %d transactions a path:\n%s", tg.driver, ops, out.String())
		})
	}
}
