package history

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMonoAdvances(t *testing.T) {
	t.Parallel()
	a := Mono()
	b := Mono()
	assert.Positive(t, a)
	assert.GreaterOrEqual(t, b, a)
}
