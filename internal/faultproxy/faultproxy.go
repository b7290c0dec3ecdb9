// Package faultproxy is an in-process TCP proxy for fault tests: it forwards
// connections to a target and can delay, blackhole, reset or refuse them, or
// lose the reply to a request, on command, so a test can cut one client off
// a real server while others keep using it.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

const (
	// Pass forwards traffic as it comes.
	Pass Mode = iota
	// Blackhole holds every byte, in both directions, and forwards nothing,
	// as a network partition does: connections stay open and silent. New
	// connections are accepted but not forwarded either. Switching back to
	// Pass delivers what was held, as TCP retransmission would.
	Blackhole
	// Refuse closes every new connection as soon as it is accepted, and an
	// open one as soon as either side sends, as a server that went down
	// does (see Cut).
	Refuse
)

// Proxy forwards TCP connections from its own loopback address to a target.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	// dropNext > 0 arms the proxy to lose the reply to the next request
	// (see DropAfterRequest).
	dropNext time.Duration
	changed  chan struct{} // closed and replaced when mode changes
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetMode switches the proxy's mode for existing and new connections.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
}

// SetLatency delays every chunk forwarded, in both directions, by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Reset closes every open connection abruptly (RST rather than FIN), as a
// crashed middlebox or server does. New connections are still forwarded.
func (p *Proxy) Reset() { p.closeAll(true) }

// Cut drops every open connection, closing it as a peer that went away
// does (FIN), and refuses new ones (mode Refuse) until Heal or SetMode.
func (p *Proxy) Cut() {
	p.SetMode(Refuse)
	p.closeAll(false)
}

// DropAfterRequest arms the proxy to lose the reply to the next request:
// the next bytes a client sends, on any connection, are forwarded, nothing
// more is forwarded back on that connection, and after delay (time for the
// server to apply the request) the connection is dropped.
func (p *Proxy) DropAfterRequest(delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNext = delay
}

// Heal disarms DropAfterRequest and passes traffic again (mode Pass),
// undoing Cut and Blackhole.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.dropNext = 0
	p.mu.Unlock()
	p.SetMode(Pass)
}

// closeAll closes every open connection, abruptly (RST) when rst is set.
func (p *Proxy) closeAll(rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok && rst {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// takeDrop disarms DropAfterRequest and returns the delay it was armed
// with, 0 when it was not.
func (p *Proxy) takeDrop() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.dropNext
	p.dropNext = 0
	return d
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to exit.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.SetMode(Pass) // release anything held
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	if p.refusing() {
		return
	}
	p.track(client)
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	p.track(server)
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	mute := make(chan struct{}) // closed: the server's replies are lost
	go func() { p.pipe(server, client, mute, true); done <- struct{}{} }()
	go func() { p.pipe(client, server, mute, false); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
}

// refusing reports whether the proxy is in Refuse mode.
func (p *Proxy) refusing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == Refuse
}

// pipe copies src to dst chunk by chunk, holding each chunk while the proxy
// is in Blackhole mode. up is the client's side, the requests: a chunk of
// them strikes an armed DropAfterRequest, which closes mute and so stops
// the other side's pipe forwarding replies.
func (p *Proxy) pipe(dst, src net.Conn, mute chan struct{}, up bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !up && isClosed(mute) {
			io.Copy(io.Discard, src) // until the connection is dropped
			return
		}
		if n > 0 {
			if !p.hold() {
				return
			}
			var drop time.Duration
			if up {
				if drop = p.takeDrop(); drop > 0 {
					close(mute)
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if drop > 0 {
				time.Sleep(drop)
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
			return
		}
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// hold waits while the proxy is blackholed, then sleeps the latency. It
// reports false when the proxy closed meanwhile or refuses traffic.
func (p *Proxy) hold() bool {
	for {
		p.mu.Lock()
		mode, changed, latency, open := p.mode, p.changed, p.latency, p.conns != nil
		p.mu.Unlock()
		if !open || mode == Refuse {
			return false
		}
		if mode == Pass {
			if latency > 0 {
				time.Sleep(latency)
			}
			return true
		}
		<-changed
	}
}
