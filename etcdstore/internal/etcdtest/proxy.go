package etcdtest

import "github.com/areev/runlease/internal/faultproxy"

// Proxy is a TCP proxy in front of one member, through which a test cuts a
// client off (Cut, Heal) or loses a reply (DropAfterRequest): the core
// module's fault proxy, giving its address as a client URL. Its methods are
// safe for concurrent use.
type Proxy struct{ *faultproxy.Proxy }

// NewProxy listens on a loopback port and forwards every connection to
// target (host:port).
func NewProxy(target string) (*Proxy, error) {
	p, err := faultproxy.Start(target)
	if err != nil {
		return nil, err
	}
	return &Proxy{p}, nil
}

// URL returns the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() { _ = p.Proxy.Close() }
