package transfer

// The file protocol: local files, reached through the Client's Files
// (files.go), which confines them to the allowed roots.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// fileProtocol reaches local files, through the Client's Files.
type fileProtocol struct{ c *Client }

func (f fileProtocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	missing := Info{Size: -1}
	if ctx.Err() != nil {
		return missing, cancelled(ctx, op, e.raw)
	}
	fi, err := f.c.files.Stat(e.url.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return missing, nil
	case err != nil:
		return missing, localError(ctx, op, e.raw, err)
	case !fi.Mode().IsRegular():
		// A named pipe or a device as a source would never end, or block
		// for ever; as a destination it would not be a file. Refused here,
		// QUERY_REPLICA and PRE_CLEAN fail at once (LOCAL_FILE: waiting
		// does not turn it into a file).
		return missing, localError(ctx, op, e.raw, &NotRegularError{Path: e.url.Path, Mode: fi.Mode()})
	}
	return Info{Exists: true, Size: fi.Size()}, nil
}

func (f fileProtocol) remove(ctx context.Context, op string, e endpoint) error {
	if ctx.Err() != nil {
		return cancelled(ctx, op, e.raw)
	}
	fi, err := f.c.files.Lstat(e.url.Path)
	if err == nil && fi.IsDir() {
		return localError(ctx, op, e.raw, errors.New("is a directory"))
	}
	if err == nil {
		err = f.c.files.Remove(e.url.Path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return localError(ctx, op, e.raw, err)
	}
	return nil
}

func (f fileProtocol) makeParents(ctx context.Context, op string, e endpoint) error {
	if ctx.Err() != nil {
		return cancelled(ctx, op, e.raw)
	}
	if err := f.c.files.MkdirAll(filepath.Dir(e.url.Path), 0o755); err != nil {
		return localError(ctx, op, e.raw, err)
	}
	return nil
}

func (f fileProtocol) open(ctx context.Context, e endpoint) (*source, error) {
	return f.c.openFile(ctx, e)
}

func (f fileProtocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, opt CopyOptions) (int64, *Error) {
	return copyToFile(ctx, f.c.files, in, p, src, dst.raw, dst.url.Path, opt.Sync)
}

func (f fileProtocol) rename(ctx context.Context, op, from, _ string, fu, tu *url.URL) error {
	if err := f.c.files.Rename(fu.Path, tu.Path); err != nil {
		return localError(ctx, op, from, err)
	}
	return nil
}

// openFile opens a local file.
func (c *Client) openFile(ctx context.Context, src endpoint) (*source, error) {
	const op = "copy"
	u, rawURL := src.url, src.raw
	if ctx.Err() != nil {
		return nil, cancelled(ctx, op, rawURL)
	}
	f, size, err := c.files.openSized(u.Path, os.O_RDONLY, 0) // a regular file, or refused at once
	if errors.Is(err, fs.ErrNotExist) {
		return nil, localError(ctx, op, rawURL, fmt.Errorf("source not found: %w", err))
	}
	if errors.Is(err, ErrNotRegular) {
		return nil, localError(ctx, op, rawURL, fmt.Errorf("source %w", err))
	}
	if err != nil {
		return nil, localError(ctx, op, rawURL, fmt.Errorf("open source: %w", err))
	}
	return &source{body: f, size: size, local: true}, nil
}

// copyToFile writes the source to path, removing it on failure.
func copyToFile(ctx context.Context, files *Files, in *source, p *pump, src, dst, path string, sync bool) (int64, *Error) {
	const op = "copy"
	// The directory is made only when the file cannot be created without
	// it: most transfers write where an earlier one made it, and MkdirAll
	// would look first.
	f, err := files.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if errors.Is(err, fs.ErrNotExist) {
		if err := files.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return 0, localError(ctx, op, dst, err)
		}
		f, err = files.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	}
	if errors.Is(err, ErrNotRegular) {
		err = fmt.Errorf("destination %w", err) // left alone: it is not ours
	}
	if err != nil {
		return 0, localError(ctx, op, dst, err)
	}
	var n int64
	var side side
	handled := false
	if p.sums.empty() {
		// No checksum wanted: the kernel copies, if it can.
		n, side, err, handled = p.kernelCopy(ctx, in, f)
	}
	if !handled {
		n, side, err = p.run(ctx, in.body, f)
	}
	var failure *Error
	switch {
	case side == sideFence:
		// The grant may be another worker's now: what was written stays
		// for the cleanup that the scheduler grants.
		_ = f.Close()
		return n, fenceError(op, dst, err)
	case ctx.Err() != nil:
		failure = cancelled(ctx, op, src)
	case side == sideSource:
		failure = sourceError(ctx, in, src, err, n)
	case side == sideDestination:
		failure = localError(ctx, op, dst, fmt.Errorf("write: %w", err))
	}
	if failure == nil && sync {
		if err := f.Sync(); err != nil {
			failure = localError(ctx, op, dst, err)
		}
	}
	if err := f.Close(); err != nil && failure == nil {
		failure = localError(ctx, op, dst, err)
	}
	if failure != nil && mayAct(ctx) {
		if err := files.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			failure.Err = fmt.Errorf("%w (cleanup: %v)", failure.Err, err)
		}
	}
	return n, failure
}

// LocalPath returns the local file path of a file:// URL, decoding any
// percent-encoding (a name with spaces, or "file://localhost/...").
func LocalPath(rawURL string) (string, error) {
	u, err := parseURL("local path", rawURL)
	if err != nil {
		return "", err
	}
	if u.Scheme != "file" {
		return "", &Error{Kind: dtr.ErrInternalLogic, Op: "local path", URL: rawURL, Err: errors.New("not a file URL")}
	}
	return u.Path, nil
}
