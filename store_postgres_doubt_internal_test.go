package runlease

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands: a write of unknown
// outcome puts its keys in doubt; only a write that changed the row and was
// acknowledged takes a key out, since only its commit waited for the
// standby after the write in doubt. A refused write, a fault that changed
// nothing and a write of another key leave the doubt as it was.
func TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reset")}
	notApplied := &StorageError{Op: "MetaCAS", Key: "k", Err: errors.New("refused")}
	var d pgDoubts
	assert.False(t, d.has("k"))
	d.note(unknown, false, "k", "other")
	assert.True(t, d.has("k"))
	assert.True(t, d.has("other"))
	for _, step := range []struct {
		name   string
		err    error
		landed bool
		key    string
	}{
		{"refused", nil, false, "k"},
		{"not applied", notApplied, false, "k"},
		{"another key landed", nil, true, "third"},
	} {
		d.note(step.err, step.landed, step.key)
		assert.True(t, d.has("k"), "after %s, k is still in doubt", step.name)
	}
	d.note(nil, true, "k")
	assert.False(t, d.has("k"), "a write of k landed")
	assert.True(t, d.has("other"))
}
