package statuspage

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	_ "embed"

	"github.com/areev/runlease"
)

// tokenTTL is how long a confirmation page's token stays good: long enough
// to read the row, short enough that a stale tab cannot release later.
const tokenTTL = 10 * time.Minute

// maxForm bounds a release POST: a run id, a row and a token.
const maxForm = 64 << 10

//go:embed release.html
var releaseHTML string

var releaseTmpl = template.Must(template.New("release").Funcs(template.FuncMap{
	"expires":  expiresText,
	"takeover": takeoverText,
}).Parse(releaseHTML))

// releaseView is what the confirmation and result pages show.
type releaseView struct {
	Store   string
	Title   string
	Message string
	Lease   *Lease // the row, as read now
	Token   string // set on a confirmation page: the form is shown
	Back    string
}

const errDisabled = "force release is disabled: this status page is read-only. " +
	"Build it with statuspage.AllowForceRelease() (runlease serve --allow-force-release) to release from here.\n"

// confirm shows the lease of ?run= and, when it can be released, the form
// that releases exactly that row.
func (h *handler) confirm(w http.ResponseWriter, r *http.Request) {
	if !h.o.allowForce {
		http.Error(w, errDisabled, http.StatusForbidden)
		return
	}
	runID := r.URL.Query().Get("run")
	now := h.now()
	info, err := runlease.Peek(r.Context(), h.store, runID, runlease.WithClock(func() time.Time { return now }))
	v := releaseView{Store: h.o.name, Title: "Release run " + runID + "?", Back: "./"}
	status := http.StatusOK
	switch {
	case errors.Is(err, runlease.ErrInvalidArgument):
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	case errors.Is(err, runlease.ErrCorruptRow):
		v.Title, v.Message = "Run "+runID+" has a corrupt row",
			"A row that does not parse is not released but repaired: see runlease repair --help."
		status = http.StatusConflict
	case err != nil:
		http.Error(w, "reading the store: "+err.Error(), http.StatusServiceUnavailable)
		return
	case !info.Found:
		v.Title, v.Message = "Run "+runID+" has no lease row", "Nothing to release."
		status = http.StatusNotFound
	case info.Released:
		l := NewLease(info, now)
		v.Lease, v.Title, v.Message = &l, "Run "+runID+" is already released", "Nothing to do."
	default:
		l := NewLease(info, now)
		v.Lease, v.Token = &l, h.token(now, runID, info.Row)
		v.Message = "This writes a released tombstone over exactly the row below, keeping fence " +
			strconv.FormatUint(info.Fence, 10) + ": the next holder gets a higher one. " +
			"If the row changes before you confirm, nothing is written."
		if info.Live {
			v.Message += " The holder " + info.Holder + " may still be running; it learns of the release at its next renewal."
		}
	}
	render(w, status, releaseTmpl, v)
}

// release force-releases the row the confirmation page showed, if the
// token is good and the row is still exactly that one.
func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	if !h.o.allowForce {
		http.Error(w, errDisabled, http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	runID, row := r.PostForm.Get("run"), r.PostForm.Get("row")
	now := h.now()
	if !h.validToken(now, r.PostForm.Get("token"), runID, row) {
		http.Error(w, "forbidden: the confirmation token is missing, wrong or older than "+tokenTTL.String()+
			"; open the release page again\n", http.StatusForbidden)
		return
	}
	at := runlease.WithClock(func() time.Time { return now })
	info, err := runlease.Peek(r.Context(), h.store, runID, at)
	v := releaseView{Store: h.o.name, Back: "./"}
	if err == nil && info.Found && info.Row == row {
		var wrote bool
		wrote, err = runlease.ForceReleaseOutcome(r.Context(), h.store, info, at)
		if wrote {
			h.snaps.forget() // the operator's next look shows the release
		}
		if runlease.IsOutcomeUnknown(err) {
			if now, perr := runlease.Peek(r.Context(), h.store, runID, at); perr == nil && now.Released && now.Fence >= info.Fence {
				h.snaps.forget()
				v.Title = "Run " + runID + " is released"
				v.Message = "Fence " + strconv.FormatUint(now.Fence, 10) + " kept. The store's reply was lost: this release or its holder's own, at the same moment, wrote the tombstone."
				render(w, http.StatusOK, releaseTmpl, v)
				return
			}
		}
		switch {
		case err == nil && wrote:
			v.Title = "Released run " + runID
			v.Message = "Fence " + strconv.FormatUint(info.Fence, 10) + " kept; the next holder continues above it."
		case err == nil:
			v.Title, v.Message = "Run "+runID+" was already released meanwhile", "Nothing was written."
		}
		if err == nil {
			render(w, http.StatusOK, releaseTmpl, v)
			return
		}
	}
	switch {
	case err != nil && !errors.Is(err, runlease.ErrLeaseLost) && !errors.Is(err, runlease.ErrCorruptRow):
		http.Error(w, "the store: "+err.Error(), http.StatusServiceUnavailable)
		return
	case err == nil && info.Found:
		l := NewLease(info, now)
		v.Lease = &l
	}
	v.Title = "Run " + runID + " changed since it was shown"
	v.Message = "Nothing was written: the row is no longer the one you confirmed. Review it and release again if it is still stuck."
	v.Back = releaseURL(runID)
	render(w, http.StatusConflict, releaseTmpl, v)
}

// token returns the token of a confirmation of runID's row: its expiry and
// an HMAC of it, the run and the exact row, under the handler's secret.
func (h *handler) token(now time.Time, runID, row string) string {
	exp := strconv.FormatInt(now.Add(tokenTTL).Unix(), 10)
	return exp + "." + h.mac(exp, runID, row)
}

// validToken reports whether tok is a token this handler made for runID's
// row that has not expired by now.
func (h *handler) validToken(now time.Time, tok, runID, row string) bool {
	exp, sum, ok := strings.Cut(tok, ".")
	if !ok {
		return false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || now.Unix() > unix {
		return false
	}
	return hmac.Equal([]byte(sum), []byte(h.mac(exp, runID, row)))
}

func (h *handler) mac(exp, runID, row string) string {
	m := hmac.New(sha256.New, h.secret)
	for _, s := range []string{"runlease statuspage release", exp, runID, row} {
		m.Write([]byte(strconv.Itoa(len(s))))
		m.Write([]byte{':'})
		m.Write([]byte(s))
	}
	return hex.EncodeToString(m.Sum(nil))
}
