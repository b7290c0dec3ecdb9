// Package statuspage provides the operator's status page for a runlease
// store: an [http.Handler] that an application mounts on its admin server,
// showing every lease (run, holder, fence, state, when it expires and when
// takeover is possible), the slots of every scope against the limits the
// operator gives, and corrupt rows, refreshed live; and GET status.json, the
// document runlease status --json prints ([Document]).
package statuspage
