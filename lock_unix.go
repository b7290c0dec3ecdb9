//go:build unix

package runlease

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path, creating the file if needed.
// flock rather than fcntl: an fcntl lock belongs to the process and is
// dropped when any descriptor of the file is closed, even one opened by
// unrelated code, while a flock belongs to the open file description, so a
// second open in the same process conflicts too. The kernel releases it when
// the process dies, so a crashed writer never leaves the store locked.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, err
	}
	return f, nil
}

// unlockFile releases a lock taken by lockFile.
func unlockFile(f *os.File) error {
	// Closing the only descriptor of the open file description drops the
	// flock; an explicit unlock first makes the release independent of any
	// descriptor a child process might have inherited.
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return f.Close()
}
