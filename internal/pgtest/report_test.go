package pgtest

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

// skipRecorder is a test that records its skip instead of reporting it, so
// that the skip this test provokes does not read as a skipped Postgres test
// in the output CI checks.
type skipRecorder struct {
	testing.TB
	msg string
}

func (r *skipRecorder) Skipf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestDSNCountsItsSkips skips a test for want of the DSN and checks that the
// skip is counted for Main's notice, which names the package and the
// variable to set.
func TestDSNCountsItsSkips(t *testing.T) {
	t.Setenv(EnvDSN, "")
	before := skipped.Load()
	r := &skipRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		DSN(r)
	}()
	<-done
	assert.Contains(t, r.msg, EnvDSN, "DSN skips, naming the variable")
	assert.Equal(t, before+1, skipped.Load())
	assert.Equal(t, "example.com/m: 1 Postgres test skipped: set "+EnvDSN+"="+ExampleDSN+" to run them", skipNotice(1, "example.com/m"))
	assert.Contains(t, skipNotice(2, "m"), "2 Postgres tests skipped")
	assert.Equal(t, "github.com/areev/runlease/internal/pgtest", packageOf("pgtest.test"))
}
