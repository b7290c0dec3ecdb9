// Package statuspage provides the operator's status page for a runlease
// store: an [http.Handler] that an application mounts on its admin server,
// showing every lease (run, holder, fence, state, when it expires and when
// takeover is possible; released leases on request), the slots of every
// scope against the limits the operator gives, every scope's queue with
// why each run waits and an explanation of one run, and corrupt rows,
// refreshed live; and GET status.json, exactly the document runlease status
// --json prints ([Document], built by [NewStatus] for both).
//
// The handler is read-only unless it is built with [AllowForceRelease]:
// then, and only then, a lease can be force-released from its confirmation
// page, which shows the exact row and fence; the POST must come from the
// page's own origin (Sec-Fetch-Site, Origin) and carry the page's token, an
// HMAC under a secret random to each handler that binds the run and the
// exact row and expires after ten minutes; and the release is conditional
// on that row, so a lease renewed or taken over meanwhile is left alone.
// The page names the store as [runlease.Target.String] does, never with a
// password. It uses no script or style from elsewhere, and serves a
// Content-Security-Policy that runs only its own.
//
//	mux.Handle("/runlease/", http.StripPrefix("/runlease",
//		statuspage.New(store, statuspage.WithTarget(target),
//			statuspage.WithLimits(map[string]int{"mem": 64}))))
//
// # Cost
//
// A read of the store is a scan of the lease rows with the requested run
// id prefix, one of the slot rows and one of the queues, and, for the
// page's why column, one [runlease.ExplainSlots] per waiting run (at most
// [MaxExplained] runs; each reads the scopes it waits in). Filters and pages are applied on the
// server, so the browser gets at most one page (100 leases by default), but
// the scan is the store's. One read answers every request for the same
// prefix for a second ([WithMaxAge]), and requests that arrive during a
// read wait for it, so pages left open do not multiply the load.
//
// BenchmarkPage100k, on an embedded store of 100,000 leases (AMD EPYC, 2
// CPUs shared with other work, so the spread is wide): a request that
// reads the store takes 175 to 290 ms and allocates 42 MB, for the first
// page, a JSON page or a state filter alike, since each scans every lease;
// 3 to 6 ms with a run id prefix matching 100 of them; 5 to 18 ms for a
// request answered from a shared read.
package statuspage
