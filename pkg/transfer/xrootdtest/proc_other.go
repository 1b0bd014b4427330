//go:build !linux

package xrootdtest

import "syscall"

// sysProcAttr sets nothing: only Linux kills a child when its parent dies.
func sysProcAttr() *syscall.SysProcAttr { return nil }
