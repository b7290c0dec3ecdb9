package runlease

// SetJitterDraw makes the backoff and poll jitter of the lease core draw
// from draw (which must be safe for concurrent use) instead of the global
// random source, so that a seeded schedule replays; nil restores the
// default.
func SetJitterDraw(draw func(n int64) int64) {
	if draw == nil {
		jitterDraw.Store(nil)
		return
	}
	jitterDraw.Store(&draw)
}
