//go:build linux

package failover_test

import (
	"net"
	"sync"
	"testing"
	"time"
)

// proxy passes the TCP connections it accepts on to its target, each
// chunk of bytes, in each direction, delay after it arrived (this
// machine's kernel has no netem); reset cuts every connection it holds
// with a RST, and retarget sends the next ones elsewhere.
type proxy struct {
	ln    net.Listener
	delay time.Duration
	mu    sync.Mutex
	addr  string
	conns map[*net.TCPConn]struct{}
	wg    sync.WaitGroup
}

// startProxy starts a proxy to addr, stopped when the test ends.
func startProxy(tb testing.TB, addr string, delay time.Duration) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, delay: delay, addr: addr, conns: map[*net.TCPConn]struct{}{}}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.reset()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// retarget makes the connections accepted from now on go to addr.
func (p *proxy) retarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addr = addr
}

// reset cuts every connection the proxy holds, both sides, with a RST.
func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.pair(c.(*net.TCPConn)) })
	}
}

// track records connections for reset, untrack forgets them.
func (p *proxy) track(cs ...*net.TCPConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *proxy) untrack(cs ...*net.TCPConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// pair passes client's bytes to a new connection to the target and back,
// until either side closes or reset cuts them.
func (p *proxy) pair(client *net.TCPConn) {
	p.mu.Lock()
	addr := p.addr
	p.mu.Unlock()
	s, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	server := s.(*net.TCPConn)
	p.track(client, server)
	defer p.untrack(client, server)
	var both sync.WaitGroup
	both.Go(func() { p.pipe(server, client) })
	p.pipe(client, server)
	both.Wait()
}

// chunk is bytes read, and when they may be passed on.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe passes what src sends to dst, each chunk delay after it was read,
// in order, and closes both when either fails.
func (p *proxy) pipe(dst, src *net.TCPConn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now().Add(p.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if wait := time.Until(c.at); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.b); err != nil {
			_ = src.Close()
			for range chunks {
			}
			return
		}
	}
}
