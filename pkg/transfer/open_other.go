//go:build !unix

package transfer

import (
	"io/fs"
	"os"
)

// openPath is os.OpenFile where os.NewFile offers no shortcut.
func openPath(p string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(p, flag, perm)
}
