// Package faultproxy is an in-process TCP proxy for fault tests: it forwards
// connections to a target and can delay, blackhole or reset them on command,
// so a test can cut one client off a real server while others keep using it.
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
)

// Proxy forwards TCP connections from its own loopback address to a target.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	changed chan struct{} // closed and replaced when mode changes
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
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
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
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
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
}

// pipe copies src to dst chunk by chunk, holding each chunk while the proxy
// is in Blackhole mode.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
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

// hold waits while the proxy is blackholed, then sleeps the latency. It
// reports false when the proxy closed meanwhile.
func (p *Proxy) hold() bool {
	for {
		p.mu.Lock()
		mode, changed, latency, open := p.mode, p.changed, p.latency, p.conns != nil
		p.mu.Unlock()
		if !open {
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
