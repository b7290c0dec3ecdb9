package etcdtest

import "syscall"

// sysProcAttr makes a member die with the test binary, so that a test
// killed midway leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
