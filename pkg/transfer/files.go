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

// Open opens p for reading.
func (f *Files) Open(p string) (*os.File, error) {
	r, rel, err := f.locate(p)
	if err != nil || r == nil {
		if err != nil {
			return nil, err
		}
		return openPath(p, os.O_RDONLY, 0)
	}
	file, err := r.Open(rel)
	return file, escape(err)
}

// OpenFile opens p with flags and permissions, as os.OpenFile.
func (f *Files) OpenFile(p string, flag int, perm fs.FileMode) (*os.File, error) {
	r, rel, err := f.locate(p)
	if err != nil || r == nil {
		if err != nil {
			return nil, err
		}
		return openPath(p, flag, perm)
	}
	file, err := r.OpenFile(rel, flag, perm)
	return file, escape(err)
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
