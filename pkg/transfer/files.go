package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// ErrOutsideRoots is wrapped by every refusal to touch a local path that
// lies outside the allowed roots.
var ErrOutsideRoots = errors.New("outside the allowed file roots")

// Files opens the local paths of file:// URLs. With roots, only paths under
// one of them can be reached, and only through os.Root: a ".." element and
// a symbolic link that leads out of its root are refused. Without roots
// (the zero value, or nil) every path can be reached.
type Files struct {
	roots []*os.Root
}

// OpenFiles makes a Files limited to dirs, creating any that is missing.
// No dirs means no limit.
func OpenFiles(dirs ...string) (*Files, error) {
	f := &Files{}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("file root %q is not an absolute path", d)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("file root: %w", err)
		}
		r, err := os.OpenRoot(filepath.Clean(d))
		if err != nil {
			return nil, fmt.Errorf("file root: %w", err)
		}
		f.roots = append(f.roots, r)
	}
	return f, nil
}

// Roots returns the allowed directories, none if every path is allowed.
func (f *Files) Roots() []string {
	if f == nil {
		return nil
	}
	out := make([]string, len(f.roots))
	for i, r := range f.roots {
		out[i] = r.Name()
	}
	return out
}

// locate finds the root that holds p and p relative to it; with no roots
// it returns p itself.
func (f *Files) locate(p string) (*os.Root, string, error) {
	if f == nil || len(f.roots) == 0 {
		return nil, p, nil
	}
	for _, part := range strings.Split(filepath.ToSlash(p), "/") {
		if part == ".." {
			return nil, "", fmt.Errorf("%s has a \"..\" element: %w", p, ErrOutsideRoots)
		}
	}
	c := filepath.Clean(p)
	for _, r := range f.roots {
		rel, err := filepath.Rel(r.Name(), c)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return r, rel, nil
		}
	}
	return nil, "", fmt.Errorf("%s is %w (%s)", c, ErrOutsideRoots, strings.Join(f.Roots(), ", "))
}

// escape turns os.Root's refusal of a link out of its root into
// ErrOutsideRoots.
func escape(err error) error {
	if err != nil && strings.Contains(err.Error(), "escapes from parent") {
		return fmt.Errorf("%w: %v", ErrOutsideRoots, err)
	}
	return err
}

// Open opens the regular file p for reading. Anything else (a named pipe,
// a device, a socket, a directory) is refused with an error wrapping
// ErrNotRegular, without blocking: see OpenFile.
func (f *Files) Open(p string) (*os.File, error) {
	return f.OpenFile(p, os.O_RDONLY, 0)
}

// OpenFile opens or creates the regular file p with flags and permissions,
// as os.OpenFile. Anything else that is there already is refused with an
// error wrapping ErrNotRegular: a transfer reading a device like /dev/zero
// would never end, and one writing through a named pipe or a device would
// not leave a file. The open itself is non-blocking, so a named pipe with
// nobody at its other end is refused at once instead of holding the caller
// for ever (a blocking open(2) does not heed any context); the descriptor
// of a regular file is made blocking again before it is returned.
func (f *Files) OpenFile(p string, flag int, perm fs.FileMode) (*os.File, error) {
	file, _, err := f.openSized(p, flag, perm)
	return file, err
}

// openSized is OpenFile that also returns the size the file had when
// opened, from the stat that found it regular.
func (f *Files) openSized(p string, flag int, perm fs.FileMode) (*os.File, int64, error) {
	r, rel, err := f.locate(p)
	if err != nil {
		return nil, 0, err
	}
	if r == nil {
		file, size, err := openPath(p, flag, perm) // refuses what is not regular
		return file, size, f.notRegular(p, err)
	}
	file, err := r.OpenFile(rel, flag|oNonblock, perm)
	if err != nil {
		return nil, 0, f.notRegular(p, escape(err))
	}
	fi, err := file.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &NotRegularError{Path: p, Mode: fi.Mode()}
	}
	if err == nil {
		err = setBlocking(file)
	}
	if err != nil {
		file.Close()
		return nil, 0, err
	}
	return file, fi.Size(), nil
}

// notRegular turns open(2)'s refusal to open a named pipe with no reader
// for writing (ENXIO) or a directory for writing (EISDIR) into a
// *NotRegularError that says what p is.
func (f *Files) notRegular(p string, err error) error {
	if errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.EISDIR) {
		if fi, serr := f.Stat(p); serr == nil && !fi.Mode().IsRegular() {
			return &NotRegularError{Path: p, Mode: fi.Mode()}
		}
	}
	return err
}

// ErrNotRegular is wrapped by every refusal to read, write or stat a local
// path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// NotRegularError is a local path that is not a regular file.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

// Error says what the path is: "is a named pipe (FIFO), not a regular
// file". Callers put "source" or "destination" in front.
func (e *NotRegularError) Error() string {
	return "is " + describeMode(e.Mode) + ", not a regular file"
}

// Is makes errors.Is(err, ErrNotRegular) hold.
func (e *NotRegularError) Is(target error) bool { return target == ErrNotRegular }

// describeMode names a kind of file that is not regular.
func describeMode(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "a file of mode " + m.String()
}

// Stat describes p, following a final symbolic link.
func (f *Files) Stat(p string) (fs.FileInfo, error) {
	r, rel, err := f.locate(p)
	if err != nil || r == nil {
		if err != nil {
			return nil, err
		}
		return os.Stat(p)
	}
	fi, err := r.Stat(rel)
	return fi, escape(err)
}

// Lstat describes p itself.
func (f *Files) Lstat(p string) (fs.FileInfo, error) {
	r, rel, err := f.locate(p)
	if err != nil || r == nil {
		if err != nil {
			return nil, err
		}
		return os.Lstat(p)
	}
	fi, err := r.Lstat(rel)
	return fi, escape(err)
}

// Remove removes p.
func (f *Files) Remove(p string) error {
	r, rel, err := f.locate(p)
	if err != nil || r == nil {
		if err != nil {
			return err
		}
		return os.Remove(p)
	}
	return escape(r.Remove(rel))
}

// Rename moves from to to; with roots both must be under the same one.
func (f *Files) Rename(from, to string) error {
	rf, relFrom, err := f.locate(from)
	if err != nil {
		return err
	}
	rt, relTo, err := f.locate(to)
	if err != nil {
		return err
	}
	if rf == nil {
		return os.Rename(from, to)
	}
	if rf != rt {
		return fmt.Errorf("rename %s to %s: they are under different roots", from, to)
	}
	return escape(rf.Rename(relFrom, relTo))
}

// MkdirAll makes dir and its parents.
func (f *Files) MkdirAll(dir string, perm fs.FileMode) error {
	r, rel, err := f.locate(dir)
	if err != nil || r == nil {
		if err != nil {
			return err
		}
		return os.MkdirAll(dir, perm)
	}
	return escape(r.MkdirAll(rel, perm))
}

// Checksum computes a checksum ("type:value") of a file:// URL's bytes.
func (c *Client) Checksum(ctx context.Context, rawURL, typ string) (string, error) {
	const op = "checksum"
	u, err := parseURL(op, rawURL)
	if err != nil {
		return "", err
	}
	if u.Scheme != "file" {
		return "", &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: errors.New("not a file URL")}
	}
	h, err := checksum.New(typ)
	if err != nil {
		return "", &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: rawURL, Err: err}
	}
	f, err := c.files.Open(u.Path)
	if err != nil {
		return "", localError(ctx, op, rawURL, err)
	}
	defer f.Close()
	// Through a recycled buffer: io.Copy from an *os.File makes a new one.
	buf, release := copyBuffer(0)
	defer release()
	if _, err := io.CopyBuffer(h, ctxReader{ctx, f}, buf[:defaultBufferSize]); err != nil {
		return "", localError(ctx, op, rawURL, err)
	}
	return checksum.Format(typ, h), nil
}

// ctxReader stops reading once ctx ends, so that hashing a large file
// does not outlast a stopping worker.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Link makes newname a hard link to oldname, both local paths; with roots
// both must lie under the same one.
func (f *Files) Link(oldname, newname string) error {
	ro, relOld, err := f.locate(oldname)
	if err != nil {
		return err
	}
	rn, relNew, err := f.locate(newname)
	if err != nil {
		return err
	}
	if ro == nil {
		return os.Link(oldname, newname)
	}
	if ro != rn {
		return fmt.Errorf("link %s to %s: they are under different roots", newname, oldname)
	}
	return escape(ro.Link(relOld, relNew))
}
