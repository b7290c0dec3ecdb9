package chaos

import "time"

// Fault kinds.
const (
	FaultPause = "pause" // SIGSTOP at T0, SIGCONT at T1
	FaultKill  = "kill"  // SIGKILL at T0; the replacement NewGen began driving at T1
)

// Fault is one fault the parent injected. Times are [history.Mono], read
// just before the signal was sent.
type Fault struct {
	Kind   string
	Slot   int // the child slot
	Gen    int // the child that was paused or killed
	NewGen int // the replacement of a killed child
	T0, T1 int64
}

// Duration returns how long the fault kept its slot down; for a kill whose
// replacement never started, 0.
func (f Fault) Duration() time.Duration {
	if f.T1 == 0 {
		return 0
	}
	return time.Duration(f.T1 - f.T0)
}

// Settle completes the faults from the children's events: a kill's T1 is
// the moment its replacement began driving. Call it once all events are in.
func Settle(faults []Fault, events []Event) {
	started := map[int]int64{}
	for _, ev := range events {
		if ev.Kind == KindStart {
			started[ev.Gen] = ev.T0
		}
	}
	for i, f := range faults {
		if f.Kind == FaultKill {
			faults[i].T1 = started[f.NewGen]
		}
	}
}

// KillTimes returns the time each killed child was killed, by generation.
func KillTimes(faults []Fault) map[int]int64 {
	out := map[int]int64{}
	for _, f := range faults {
		if f.Kind == FaultKill {
			out[f.Gen] = f.T0
		}
	}
	return out
}
