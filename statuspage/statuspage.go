package statuspage

import (
	"crypto/rand"
	"embed"
	"fmt"
	"net/http"
	"time"

	"github.com/areev/runlease"
)

// DefaultPageSize is how many leases the page shows when the request gives
// no limit (status.json then shows every matching lease, as runlease
// status --json does); MaxPageSize is the most a request may ask for.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Option configures the handler [New] returns.
type Option func(*options)

type options struct {
	name, table string
	limits      map[string]int
	now         func() time.Time // nil: the store's clock, else time.Now
	allowForce  bool
	maxAge      time.Duration
}

// WithTarget names the store on the page as target.String() does, never
// with a password, and, for a Postgres target, shows its table. Without it
// (or [WithName]) the page names the store "store".
func WithTarget(target runlease.Target) Option {
	return func(o *options) {
		o.name = target.String()
		if target.Kind == runlease.TargetPostgres {
			o.table = target.Table
		}
	}
}

// WithName names the store on the page, overriding [WithTarget]'s name. The
// name is shown to everyone who can open the page: give a name such as
// [runlease.Target.String] returns, never a DSN.
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithLimits gives the slot limit of each scope, which is the claiming
// hosts' configuration and not stored, so that the page shows used/limit.
// Scopes in limits that hold no slot are shown empty. The map is copied.
// [New] panics on a limit outside 1 to [runlease.MaxSlotLimit].
func WithLimits(limits map[string]int) Option {
	return func(o *options) {
		for scope, n := range limits {
			if n < 1 || n > runlease.MaxSlotLimit {
				panic(fmt.Sprintf("statuspage: %s: WithLimits: scope %q: limit %d outside [1, %d]",
					runlease.CodeInvalidArgument, scope, n, runlease.MaxSlotLimit))
			}
			o.limits[scope] = n
		}
	}
}

// WithClock makes now the clock that judges which leases are live. By
// default the page uses the store's clock when it implements
// [runlease.Clock] (Postgres: the server's), else time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// AllowForceRelease lets operators force-release a lease from the page, as
// [runlease.ForceRelease] does. Without it the handler never writes to the
// store and refuses every release request with 403 Forbidden. With it, a
// release takes a confirmation page showing the exact row and fence, a POST
// from the same origin carrying the confirmation's token, and is
// conditional on the row shown: a row that changed meanwhile is left alone
// (409 Conflict). The store must then be writable (for SQLite, opened with
// [runlease.OpenSQLite], not read-only).
func AllowForceRelease() Option { return func(o *options) { o.allowForce = true } }

// handler serves the page, status.json and the release flow.
type handler struct {
	store  runlease.Store
	o      options
	secret []byte // signs release tokens; random per handler
	mux    *http.ServeMux
	snaps  snapshots
}

//go:embed assets
var assets embed.FS

// New returns the status page of store, which it reads on every request and
// writes only when [AllowForceRelease] is given. It serves, relative to
// where it is mounted (use [http.StripPrefix] to mount it below a path):
//
//   - GET / the page, refreshed every two seconds by a small script
//     from GET page.json ([Page]); it hides released leases unless asked
//     (released=1, or a state filter that names them), shows every scope's
//     queue with why each waiter waits ([runlease.ExplainSlots], for the
//     scopes given [WithLimits]), and explains one run (explain=RUN);
//   - GET status.json the [Document] that runlease status --json prints,
//     built by [NewStatus] for both, with the query parameters state
//     (live, expired, released, corrupt; comma-separated or repeated; every
//     state without it), run (a run id prefix), limit (1 to [MaxPageSize]:
//     status --max; every matching lease without it) and offset, which
//     the page takes too (its limit defaulting to [DefaultPageSize]);
//   - GET release?run=ID and POST release, the force-release flow, only
//     with AllowForceRelease (403 Forbidden otherwise).
//
// A read that fails is served as 503 Service Unavailable with the error's
// text, which runlease keeps free of passwords. The handler is safe for
// concurrent use. New panics when store is nil or an option is invalid:
// both are programming errors.
func New(store runlease.Store, opts ...Option) http.Handler {
	if store == nil {
		panic("statuspage: " + runlease.CodeInvalidArgument + ": New: nil store")
	}
	h := &handler{store: store, o: options{name: "store", limits: map[string]int{}, maxAge: DefaultMaxAge}, secret: make([]byte, 32)}
	for _, opt := range opts {
		opt(&h.o)
	}
	h.snaps.byPrefix = map[string]*snapshot{}
	_, _ = rand.Read(h.secret) // crypto/rand.Read never fails
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("GET /status.json", h.json)
	mux.HandleFunc("GET /page.json", h.pageJSON)
	mux.Handle("GET /assets/", http.FileServerFS(assets))
	mux.HandleFunc("GET /release", h.confirm)
	mux.HandleFunc("POST /release", h.release)
	h.mux = mux
	// Cross-origin POSTs are refused before the token is even looked at:
	// browsers send Sec-Fetch-Site or Origin with every POST.
	return http.NewCrossOriginProtection().Handler(h)
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "+
		"connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

// now returns the instant the rows of one response are judged at.
func (h *handler) now() time.Time {
	if h.o.now != nil {
		return h.o.now()
	}
	if c, ok := h.store.(runlease.Clock); ok {
		now, _ := c.ClockNow()
		return now
	}
	return time.Now()
}
