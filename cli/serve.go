package cli

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/areev/runlease/statuspage"
)

const serveHelp = `
Serve serves the status page of a store over HTTP, refreshed every two
seconds in the browser: every lease (run, holder, fence, state, when it
expires and when takeover is possible, both relative to now), released
leases hidden unless asked for (a link, ?released=1, or a state filter);
the slots of every scope (used/limit for the scopes given with --limit);
corrupt rows flagged; and every scope's queue: who waits for slots, first
first, with principal, priority, units, how long it has waited, and why it
waits (capacity: the units in use leave too few; order: units are free
but waiters ranked ahead reserve them), with a link to an explanation of
one run (?explain=RUN: used/limit, its place, the units reserved ahead,
who is ahead and who holds the slots), as explain prints it. A reason
needs the scope's --limit, the limit its drivers claim with.

status.json is exactly the document status --json prints, built by the
same code, for the same filters: ?state= (as --state; released leases are
shown unless it leaves them out), ?run= (as --run), ?limit=N (as --max N,
1 to 1000; every matching lease without it) and ?offset=.

It listens on 127.0.0.1:8080 unless told otherwise, and only on a loopback
address unless --listen-any is given: the page shows every run and holder
to whoever can reach it. On loopback it answers only requests addressed to
a loopback host, so that a web page elsewhere cannot reach it by renaming
its own server (DNS rebinding).

The page is read-only, and an embedded store is opened read-only, beside
the driver that has it open. --allow-force-release adds a release link to
each live or expired lease: a confirmation page shows the exact row and
fence, and the release (a same-origin POST carrying the page's token) is
conditional on that row. It needs the store's writer: an embedded store
that a driver has open is refused with RUN-E010.

Serve runs until interrupted (SIGINT, SIGTERM), then lets requests in
flight finish for up to five seconds. --timeout bounds each request's
reads of the store; pages open at the same time share one read a second.
`

// shutdownGrace is how long serve lets requests in flight finish once
// interrupted.
const shutdownGrace = 5 * time.Second

type serveOpts struct {
	store      storeFlags
	listen     string
	listenAny  bool
	allowForce bool
	limits     limitsFlag
}

func (c *cli) serve(args []string) error {
	o := serveOpts{limits: limitsFlag{}}
	fs := c.newFlags("serve", "[flags]", serveHelp)
	c.registerStore(fs.FlagSet, &o.store)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "listen on `HOST:PORT`; a loopback address unless --listen-any")
	fs.BoolVar(&o.listenAny, "listen-any", false, "allow --listen on an address other than loopback: anyone who reaches it sees every lease")
	fs.BoolVar(&o.allowForce, "allow-force-release", false, "allow force-releasing a lease from the page, after a confirmation (needs the store's writer)")
	fs.Var(o.limits, "limit", "a scope's limit, `SCOPE=N`, to show used/limit (repeatable)")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("serve", "unexpected argument %q", pos[0])
	}
	loopback, err := o.checkListen()
	if err != nil {
		return err
	}
	access := readOnly
	if o.allowForce {
		access = readWrite
	}
	s, err := c.open(fs.FlagSet, &o.store, access)
	if err != nil {
		return err
	}
	defer s.close()
	h := o.handler(s, loopback)
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	mode := "read-only"
	if o.allowForce {
		mode = "force release allowed, after a confirmation"
	}
	fmt.Fprintf(c.stdout, "serving the status page of %s at http://%s/ (%s); interrupt to stop\n", s.name, ln.Addr(), mode)
	return c.serveUntilDone(ln, h)
}

// checkListen checks --listen, and reports whether it is a loopback
// address: any other needs --listen-any.
func (o *serveOpts) checkListen() (loopback bool, err error) {
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return false, usagef("serve", "--listen %q: want HOST:PORT, such as 127.0.0.1:8080", o.listen)
	}
	loopback = isLoopback(host)
	if !loopback && !o.listenAny {
		return false, usagef("serve", "--listen %q is not a loopback address: the page shows every lease to whoever "+
			"reaches it; give --listen-any to serve it there anyway", o.listen)
	}
	return loopback, nil
}

// handler returns the status page of s as the flags configure it.
func (o *serveOpts) handler(s *openedStore, loopback bool) http.Handler {
	var opts []statuspage.Option
	if s.target != nil {
		opts = append(opts, statuspage.WithTarget(*s.target))
	}
	opts = append(opts, statuspage.WithName(s.name), statuspage.WithLimits(o.limits))
	if o.allowForce {
		opts = append(opts, statuspage.AllowForceRelease())
	}
	h := withTimeout(statuspage.New(s.s, opts...), o.store.timeout)
	if loopback {
		h = loopbackOnly(h)
	}
	return h
}

// serveUntilDone serves h on ln until the command is interrupted, then
// shuts the server down gracefully.
func (c *cli) serveUntilDone(ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(c.stderr, "runlease: serve: ", 0)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-c.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := srv.Shutdown(ctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("serve: shutting down: %w", err)
	}
	fmt.Fprintln(c.stdout, "stopped")
	return nil
}

// withTimeout bounds each request's work with the store by d.
func withTimeout(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// loopbackOnly refuses requests whose Host is not a loopback name or
// address: a browser reaching a loopback port through a hostile name
// (DNS rebinding) sends that name.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hp, _, err := net.SplitHostPort(host); err == nil {
			host = hp
		}
		if !isLoopback(host) {
			http.Error(w, "misdirected request: this status page answers only on loopback names", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
