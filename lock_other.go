//go:build !unix

package runlease

import (
	"os"
	"path/filepath"
	"sync"
)

// On platforms without flock the writer lock is enforced within this process
// only; two processes opening one file there are not detected.
var (
	lockedMu sync.Mutex
	locked   = map[string]bool{}
)

func lockFile(path string) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	lockedMu.Lock()
	defer lockedMu.Unlock()
	if locked[abs] {
		return nil, errLocked
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	locked[abs] = true
	return f, nil
}

func unlockFile(f *os.File) error {
	abs, _ := filepath.Abs(f.Name())
	lockedMu.Lock()
	delete(locked, abs)
	lockedMu.Unlock()
	return f.Close()
}
