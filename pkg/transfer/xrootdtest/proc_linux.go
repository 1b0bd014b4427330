package xrootdtest

import "syscall"

// sysProcAttr makes the kernel kill xrootd if the test binary dies before
// its cleanup stops it, so no server outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
