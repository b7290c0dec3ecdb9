package etcdtest

import (
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy in front of one member, through which a test cuts a
// client off or loses a reply. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    map[*link]struct{}
	cut      bool          // refuse connections: accept and close at once
	dropNext time.Duration // > 0: the next request is forwarded, then its link dropped after this long
	wg       sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	mute           chan struct{} // closed: replies are no longer forwarded
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// NewProxy listens on a loopback port and forwards every connection to
// target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL returns the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Cut drops every connection and refuses new ones until [Proxy.Heal].
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for l := range p.conns {
		l.close()
	}
}

// DropAfterRequest arms the proxy to lose the reply to the next request: the
// next bytes a client sends are forwarded, nothing more is forwarded back,
// and after delay (time for the server to apply the request) the connection
// is dropped.
func (p *Proxy) DropAfterRequest(delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNext = delay
}

// Heal undoes Cut and disarms DropAfterRequest.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.dropNext = false, 0
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s, mute: make(chan struct{})}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.up(l)
		go p.down(l)
	}
}

// up forwards a client's bytes to the server, and strikes an armed drop.
func (p *Proxy) up(l *link) {
	defer p.wg.Done()
	defer p.forget(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay := p.dropNext
			p.dropNext = 0
			p.mu.Unlock()
			if delay > 0 {
				close(l.mute)
			}
			if _, werr := l.server.Write(buf[:n]); werr != nil {
				return
			}
			if delay > 0 {
				time.Sleep(delay)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down forwards the server's bytes to the client until the link is muted.
func (p *Proxy) down(l *link) {
	defer p.wg.Done()
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		select {
		case <-l.mute:
			io.Copy(io.Discard, l.server)
			return
		default:
		}
		if n > 0 {
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}
