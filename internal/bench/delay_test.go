package bench

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// A database across a network, for the pgx measurements: a TCP proxy in
// front of the server that holds each chunk of bytes, in each direction,
// for half a round trip before it passes it on. This machine's kernel has
// no netem, so the delay is the proxy's. Its own reads and writes cost
// this process a little CPU per chunk, as a network stack costs a host
// per packet.

// dbRTT is the round trip to the database that IDEM_BENCH_DB_RTT asks
// for ("500us", say), or 0 for a direct connection. A value that is not a
// duration fails tb.
func dbRTT(tb testing.TB) time.Duration {
	tb.Helper()
	v := os.Getenv("IDEM_BENCH_DB_RTT")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		tb.Fatalf("IDEM_BENCH_DB_RTT=%q: want a duration such as 500us", v)
	}
	return d
}

// delayProxy passes the connections it accepts on to target, each chunk
// of bytes delay after it arrived.
type delayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration // one way: half the round trip
	bufs   sync.Pool
	wg     sync.WaitGroup
}

// startDelayProxy starts a proxy to the server at target that adds rtt
// to each round trip, closed when tb ends, and returns its address.
func startDelayProxy(tb testing.TB, target string, rtt time.Duration) *net.TCPAddr {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &delayProxy{ln: ln, target: target, delay: rtt / 2,
		bufs: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
	p.wg.Go(p.serve)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr)
}

func (p *delayProxy) serve() {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		conns.Go(func() { p.pair(c) })
	}
}

// pair passes client's bytes to a new connection to the target and the
// target's back, until either side closes.
func (p *delayProxy) pair(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	var both sync.WaitGroup
	both.Go(func() { p.pipe(server, client) })
	p.pipe(client, server)
	both.Wait()
}

// chunk is bytes read, and when they may be passed on.
type chunk struct {
	buf *[]byte
	n   int
	at  time.Time
}

// pipe passes what src sends to dst, each chunk delay after it was read,
// in order, and closes both when either fails.
func (p *delayProxy) pipe(dst, src net.Conn) {
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			buf := p.bufs.Get().(*[]byte)
			n, err := src.Read(*buf)
			if n > 0 {
				chunks <- chunk{buf, n, time.Now().Add(p.delay)}
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
		_, err := dst.Write((*c.buf)[:c.n])
		p.bufs.Put(c.buf)
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	for c := range chunks { // src is closed: its reader ends
		p.bufs.Put(c.buf)
	}
}

// TestDelayProxy checks that the proxy passes bytes on whole and in
// order, and that a round trip through it takes its round trip.
func TestDelayProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		echoed <- err
	}()
	const rtt = 20 * time.Millisecond
	c, err := net.Dial("tcp", startDelayProxy(t, ln.Addr().String(), rtt).String())
	if err != nil {
		t.Fatal(err)
	}
	sent := make([]byte, 256<<10) // more than a chunk
	for i := range sent {
		sent[i] = byte(i * 7)
	}
	start := time.Now()
	if _, err := c.Write(sent); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < rtt {
		t.Errorf("a round trip took %v, want at least %v", took, rtt)
	}
	if !bytes.Equal(got, sent) {
		t.Error("the bytes came back changed or out of order")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-echoed; err != nil {
		t.Errorf("echo: %v", err)
	}
}
