package benchkit

import (
	"os"
	"runtime/pprof"
	"sync"
)

// StartCPUProfile starts a CPU profile written to path, and returns the
// func that ends it (safe to call more than once); with no path it does
// nothing.
func StartCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	var closeErr error
	return func() error {
		once.Do(func() {
			pprof.StopCPUProfile()
			closeErr = f.Close()
		})
		return closeErr
	}, nil
}
