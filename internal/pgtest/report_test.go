package pgtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDSNCountsItsSkips skips a test for want of the DSN and checks that the
// skip is counted for Main's notice, which names the package and the
// variable to set.
func TestDSNCountsItsSkips(t *testing.T) {
	t.Setenv(EnvDSN, "")
	before := skipped.Load()
	t.Run("postgres", func(t *testing.T) { DSN(t) })
	assert.Equal(t, before+1, skipped.Load())
	assert.Equal(t, "example.com/m: 1 Postgres test skipped: set "+EnvDSN+"="+ExampleDSN+" to run them", skipNotice(1, "example.com/m"))
	assert.Contains(t, skipNotice(2, "m"), "2 Postgres tests skipped")
	assert.Equal(t, "github.com/areev/runlease/internal/pgtest", packageOf("pgtest.test"))
}
