package statuspage

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/areev/runlease"
)

// TestWhyCountsUnitsInProperPlural: a scope of one unit says "1 unit",
// not "1 units".
func TestWhyCountsUnitsInProperPlural(t *testing.T) {
	full := runlease.ScopeExplanation{Queued: true, BlockedBy: "capacity", Used: 1, Limit: 1, Units: 1}
	assert.Equal(t, "capacity: 1 of 1 unit in use, 0 free; it asks 1", whyText(full).Text)
	ahead := runlease.ScopeExplanation{Queued: true, BlockedBy: "order", Used: 0, Limit: 1, Units: 1, Reserved: 1, Position: 1}
	assert.Equal(t, "order: 1 of 1 unit free, 1 reserved by the 1 waiter ahead; it asks 1", whyText(ahead).Text)
}
