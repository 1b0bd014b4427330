//go:build unix

package transfer

import (
	"io/fs"
	"os"
	"syscall"
)

// openPath opens p as os.OpenFile does, but hands the descriptor to
// os.NewFile instead of the runtime's poller. os.OpenFile tries to add every
// file it opens to the poller; for a regular file on Linux that costs four
// fcntl calls and an epoll_ctl that fails, against one fcntl here, and a
// transfer opens two or three files. Reads and writes of regular files
// block their thread either way; nothing here sets deadlines on files.
func openPath(p string, flag int, perm fs.FileMode) (*os.File, error) {
	for {
		fd, err := syscall.Open(p, flag|syscall.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			return os.NewFile(uintptr(fd), p), nil
		}
		if err != syscall.EINTR {
			return nil, &fs.PathError{Op: "open", Path: p, Err: err}
		}
	}
}
