package cli

import (
	"testing"

	"github.com/areev/runlease/internal/pgtest"
)

// TestMain says, after the tests, how many Postgres tests were skipped.
func TestMain(m *testing.M) { pgtest.Main(m) }
