//go:build race

package runlease_test

// raceEnabled is set when the race detector runs, so that long tests can
// size themselves to its cost.
const raceEnabled = true
