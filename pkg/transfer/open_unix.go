//go:build unix

package transfer

import (
	"io/fs"
	"os"
	"syscall"
)

// oNonblock opens a named pipe without waiting for its other end.
const oNonblock = syscall.O_NONBLOCK

// openPath opens the regular file p as os.OpenFile does, but hands the
// descriptor to os.NewFile instead of the runtime's poller. os.OpenFile
// tries to add every file it opens to the poller; for a regular file on
// Linux that costs four fcntl calls and an epoll_ctl that fails, against
// two fcntl calls and an fstat here, and a transfer opens two or three
// files. Reads and writes of regular files block their thread either way;
// nothing here sets deadlines on files.
//
// The open is non-blocking (a named pipe with nobody at its other end
// would otherwise hold it for ever); anything that is not a regular file
// is refused with a *NotRegularError, and a regular file's descriptor is
// made blocking again. It returns the file's size when opened too.
func openPath(p string, flag int, perm fs.FileMode) (*os.File, int64, error) {
	for {
		fd, err := syscall.Open(p, flag|syscall.O_NONBLOCK|syscall.O_CLOEXEC, uint32(perm.Perm()))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, &fs.PathError{Op: "open", Path: p, Err: err}
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			syscall.Close(fd)
			return nil, 0, &fs.PathError{Op: "stat", Path: p, Err: err}
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			syscall.Close(fd)
			return nil, 0, &NotRegularError{Path: p, Mode: modeOf(uint32(st.Mode))}
		}
		// F_SETFL takes only the status flags (O_APPEND, O_NONBLOCK...)
		// of flag: the caller's, without O_NONBLOCK.
		if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFL, uintptr(flag&^syscall.O_NONBLOCK)); e != 0 {
			syscall.Close(fd)
			return nil, 0, &fs.PathError{Op: "fcntl", Path: p, Err: e}
		}
		return os.NewFile(uintptr(fd), p), st.Size, nil
	}
}

// modeOf turns the file type bits of a stat(2) mode into an fs.FileMode.
func modeOf(m uint32) fs.FileMode {
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFIFO:
		return fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return fs.ModeSocket
	case syscall.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return fs.ModeDevice
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	}
	return fs.ModeIrregular
}

// setBlocking makes a regular file opened with oNonblock blocking again.
func setBlocking(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.SetNonblock(int(fd), false) }); err != nil {
		return err
	}
	return serr
}
