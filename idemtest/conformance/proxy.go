package conformance

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a proxy does with the next COMMIT a client sends.
const (
	passCommit      int32 = iota
	loseCommitReply       // forward it, swallow the server's reply, cut the connection
	loseCommit            // cut the connection before it reaches the server
)

// proxy is a TCP proxy between the suite and a database server that can
// lose a COMMIT or the reply to it, as a network fault or a client crash
// at that moment would.
type proxy struct {
	t       *testing.T
	ln      net.Listener
	network string // how to reach the server: "tcp" or "unix"
	addr    string
	mode    atomic.Int32
	cuts    atomic.Int64 // connections cut at a COMMIT
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
}

// startProxy starts a proxy in front of the target's server, stopped when
// the test ends.
func (e *env) startProxy() *proxy {
	e.t.Helper()
	network, addr := e.serverAddr()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatalf("proxy: %v", err)
	}
	p := &proxy{t: e.t, ln: ln, network: network, addr: addr, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	e.t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// arm makes the proxy cut the connection at the next COMMIT, as mode says.
func (p *proxy) arm(mode int32) { p.mode.Store(mode) }

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(client) })
	}
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *proxy) serve(client net.Conn) {
	server, err := net.Dial(p.network, p.addr)
	if err != nil {
		_ = client.Close()
		return
	}
	p.track(client)
	p.track(server)
	closeBoth := sync.OnceFunc(func() {
		_ = client.Close()
		_ = server.Close()
		p.mu.Lock()
		delete(p.conns, client)
		delete(p.conns, server)
		p.mu.Unlock()
	})
	defer closeBoth()
	var swallow atomic.Bool
	p.wg.Go(func() {
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if swallow.Load() {
					return // the reply to the COMMIT is lost
				}
				if _, err := client.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if isCommit(buf[:n]) {
				switch p.mode.Swap(passCommit) {
				case loseCommit:
					p.cuts.Add(1)
					return
				case loseCommitReply:
					p.cuts.Add(1)
					swallow.Store(true)
				}
			}
			if _, err := server.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// isCommit reports a client message that is a COMMIT: a simple query
// "COMMIT" on Postgres (lib/pq sends it in capitals, pgx in lower case), a
// COM_QUERY "COMMIT" on MySQL. Both drivers send it in one write.
func isCommit(msg []byte) bool {
	msg = bytes.ToLower(msg)
	return bytes.HasSuffix(msg, []byte("commit\x00")) || bytes.HasSuffix(msg, []byte("\x03commit"))
}

// open returns a pool of at most conns connections through the proxy,
// with the target's driver, closed when the test ends.
func (p *proxy) open(e *env, conns int) pool {
	e.t.Helper()
	return e.openOn(e.proxiedDSN(p.ln.Addr().String()), conns)
}

// serverAddr is where the target's DSN points.
func (e *env) serverAddr() (network, addr string) {
	e.t.Helper()
	e.needFact("ParseAddr", e.ParseAddr != nil)
	network, addr, err := e.ParseAddr(e.dsn)
	if err != nil {
		e.t.Fatalf("parse %s: %v", e.dsn, err)
	}
	return network, addr
}

// proxiedDSN is the target's DSN pointed at addr instead.
func (e *env) proxiedDSN(addr string) string {
	e.t.Helper()
	e.needFact("RedirectDSN", e.RedirectDSN != nil)
	dsn, err := e.RedirectDSN(e.dsn, addr)
	if err != nil {
		e.t.Fatalf("parse %s: %v", e.dsn, err)
	}
	return dsn
}

// mysqlAddr is where a DSN of go-sql-driver/mysql points.
func mysqlAddr(dsn string) (network, addr string, err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", "", err
	}
	return cfg.Net, cfg.Addr, nil
}

// mysqlRedirect is a DSN of go-sql-driver/mysql pointed at TCP address
// addr.
func mysqlRedirect(dsn, addr string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	cfg.Net, cfg.Addr = "tcp", addr
	return cfg.FormatDSN(), nil
}

// pgAddr is where a PostgreSQL DSN (a URL or key=value settings) points.
func pgAddr(dsn string) (network, addr string, err error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port)), nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), nil
}

// pgRedirect is a PostgreSQL DSN pointed at TCP address addr.
func pgRedirect(dsn, addr string) (string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Host = addr
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	host, port, _ := net.SplitHostPort(addr)
	return dsn + " host=" + host + " port=" + port, nil // later settings win
}
