//go:build !unix

package runlease

import (
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// On platforms without flock the writer lock is enforced within this process
// only, by path; two processes opening one file there are not detected, nor
// are two names of one file.
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

// dbLock stands for the lock on the database file, which this platform
// does not take: the side file's lock is the only one.
type dbLock struct{}

func lockDatabase(string) (*dbLock, error) { return &dbLock{}, nil }

func (*dbLock) unlock() error { return nil }

// checkLinks accepts every file: hard links are not counted here.
func checkLinks(fs.FileInfo) error { return nil }
