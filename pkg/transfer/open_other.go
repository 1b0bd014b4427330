//go:build !unix

package transfer

import (
	"io/fs"
	"os"
)

// oNonblock is not needed where there are no named pipes to block on.
const oNonblock = 0

// openPath is os.OpenFile where os.NewFile offers no shortcut, refusing
// anything that is not a regular file with a *NotRegularError. It returns
// the file's size when opened too.
func openPath(p string, flag int, perm fs.FileMode) (*os.File, int64, error) {
	f, err := os.OpenFile(p, flag, perm)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &NotRegularError{Path: p, Mode: fi.Mode()}
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// setBlocking has nothing to do without oNonblock.
func setBlocking(*os.File) error { return nil }
