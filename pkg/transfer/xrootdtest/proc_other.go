//go:build !linux

package xrootdtest

import "syscall"

// switchesUser says sysProcAttr starts xrootd as the user given: not here,
// where xrootd's -R does.
const switchesUser = false

// sysProcAttr sets nothing: only Linux kills a child when its parent dies.
func sysProcAttr(int, int) *syscall.SysProcAttr { return nil }
