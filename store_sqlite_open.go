package runlease

import (
	"errors"
	"fmt"
	"path/filepath"
)

// hardLinkedError refuses a database file that has more than one name.
// SQLite keeps a store's write-ahead log and shared memory in files named
// after the name it opened (path-wal, path-shm), so an opener by another
// name would not see commits still in the log: it would read old rows, and
// in this process SQLite fails with a disk I/O error.
type hardLinkedError struct{ links uint64 }

func (e *hardLinkedError) Error() string {
	return fmt.Sprintf("the file has %d hard links; SQLite keeps the write-ahead log beside "+
		"the name it opens, so another name would miss commits: remove the other links "+
		"(a symbolic link is fine)", e.links)
}

// openLockError is the error of an OpenSQLite whose lock was not taken.
func openLockError(path string, err error) error {
	var hl *hardLinkedError
	switch {
	case errors.Is(err, errLocked):
		return &StoreLockedError{Path: path}
	case errors.As(err, &hl):
		return invalidArg("path", "%q: %v", path, hl)
	}
	return &StorageError{Op: "OpenSQLite", Key: path, Err: err}
}

// canonicalPath resolves path to an absolute path without symbolic links in
// its directory, so two spellings of one file take the same lock.
func canonicalPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	abs = filepath.Join(dir, filepath.Base(abs))
	if target, err := filepath.EvalSymlinks(abs); err == nil {
		abs = target
	}
	return abs, nil
}
