//go:build unix

package runlease

import (
	"errors"
	"io/fs"
	"os"
	"sync"
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
	if err := flockExclusive(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// flockExclusive takes an exclusive flock on f without waiting; errLocked
// when another open file description holds one.
func flockExclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errLocked
		}
		return err
	}
}

// unlockFile releases a lock taken by lockFile.
func unlockFile(f *os.File) error {
	// Closing the only descriptor of the open file description drops the
	// flock; an explicit unlock first makes the release independent of any
	// descriptor a child process might have inherited.
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return f.Close()
}

// fileID is a file's identity: every name (hard link) of one file has it.
type fileID struct{ dev, ino uint64 }

// identity returns the identity and the number of hard links of the file fi
// describes.
func identity(fi fs.FileInfo) (fileID, uint64) {
	st := fi.Sys().(*syscall.Stat_t)
	return fileID{uint64(st.Dev), uint64(st.Ino)}, uint64(st.Nlink)
}

// Database files this process holds the writer lock of, by identity, and
// descriptors of them that must stay open until their holder closes.
var (
	heldMu sync.Mutex
	held   = map[fileID]bool{}
	parked = map[fileID][]*os.File{}
)

// dbLock is the writer lock on the database file itself.
type dbLock struct {
	f  *os.File
	id fileID
}

// lockDatabase takes the writer's lock on the database file at path itself,
// creating it (empty) if needed: an exclusive flock, which follows the file
// whatever name opens it and even when path+".lock" was deleted. SQLite's
// own locks are fcntl locks, which on Linux and the BSDs are independent of
// flock (on NFS, Linux emulates flock with fcntl and this lock is weaker).
//
// A file this process already holds is refused from a table of
// identities, before any descriptor is opened: closing a second descriptor
// of the file would drop the fcntl locks SQLite holds on it in this
// process. A file with more than one hard link is refused with
// errHardLinked (see checkLinks).
func lockDatabase(path string) (*dbLock, error) {
	heldMu.Lock()
	defer heldMu.Unlock()
	fi, err := os.Stat(path)
	switch {
	case err == nil:
		id, links := identity(fi)
		if links > 1 {
			return nil, &hardLinkedError{links}
		}
		if held[id] {
			return nil, errLocked
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, err
	}
	id, links := identity(fi)
	if held[id] {
		// Renamed into place since the Stat above. Closing f now would drop
		// the fcntl locks of the store that holds the file: f stays open
		// until that store closes.
		parked[id] = append(parked[id], f)
		return nil, errLocked
	}
	if links > 1 {
		err = &hardLinkedError{links}
	} else {
		err = flockExclusive(f)
	}
	if err != nil {
		// Held by no store of this process (the table says so), so no
		// SQLite writer here loses its locks when this descriptor closes.
		f.Close()
		return nil, err
	}
	held[id] = true
	return &dbLock{f: f, id: id}, nil
}

// unlock releases the lock. Call it only after SQLite closed the file.
func (l *dbLock) unlock() error {
	heldMu.Lock()
	defer heldMu.Unlock()
	delete(held, l.id)
	for _, f := range parked[l.id] {
		f.Close()
	}
	delete(parked, l.id)
	return unlockFile(l.f)
}

// checkLinks refuses a database file with more than one hard link.
func checkLinks(fi fs.FileInfo) error {
	if _, links := identity(fi); links > 1 {
		return &hardLinkedError{links}
	}
	return nil
}
