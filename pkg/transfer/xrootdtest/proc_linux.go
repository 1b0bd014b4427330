package xrootdtest

import "syscall"

// switchesUser says sysProcAttr starts xrootd as the user given, so that
// it needs no -R.
const switchesUser = true

// sysProcAttr starts xrootd as uid:gid (unless -1), and makes the kernel
// kill it if the test binary dies before its cleanup stops it, so that no
// server outlives its test. The user is switched here rather than by
// xrootd's own -R because the kernel forgets the parent-death signal of a
// process that changes its user, and Go asks for it after the change.
func sysProcAttr(uid, gid int) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid >= 0 {
		a.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return a
}
