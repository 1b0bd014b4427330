package transfer

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"path/filepath"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// protocol is what Sluice needs of a storage protocol; each URL scheme has
// one (file; http, https, dav, davs; s3, s3s; root). Client's exported
// methods parse the URL, pick the protocol and call it; Copy opens the
// source with one protocol and writes with another. The conformance suite
// (conformance_test.go) runs the same operations against every one.
type protocol interface {
	// stat describes an object; a missing one is Info{Exists: false}.
	stat(ctx context.Context, op string, e endpoint) (Info, error)
	// remove deletes an object; a missing one is not an error.
	remove(ctx context.Context, op string, e endpoint) error
	// makeParents makes what must exist before an object can be written.
	makeParents(ctx context.Context, op string, e endpoint) error
	// open opens an object for reading.
	open(ctx context.Context, e endpoint) (*source, error)
	// write streams a source into an object through the pump and, on
	// failure, leaves nothing of its own behind.
	write(ctx context.Context, in *source, p *pump, src string, dst endpoint, opt CopyOptions) (int64, *Error)
	// rename puts the object from (parsed: fu) in place at to (tu),
	// replacing what is there; only schemes that dtr.SchemeTable says
	// rename are asked.
	rename(ctx context.Context, op, from, to string, fu, tu *url.URL) error
}

// protocols holds the protocol of every scheme of dtr.SchemeTable: adding
// a protocol is a file that implements it, an entry here, a row of the
// scheme table and a row of the conformance suite.
var protocols = map[string]func(*Client) protocol{
	"file":  func(c *Client) protocol { return fileProtocol{c} },
	"http":  func(c *Client) protocol { return httpProtocol{c} },
	"https": func(c *Client) protocol { return httpProtocol{c} },
	"dav":   func(c *Client) protocol { return httpProtocol{c} },
	"davs":  func(c *Client) protocol { return httpProtocol{c} },
	"s3":    func(c *Client) protocol { return s3Protocol{c} },
	"s3s":   func(c *Client) protocol { return s3Protocol{c} },
	"root":  func(c *Client) protocol { return xrootdProtocol{c} },
}

// protocol returns the protocol of a URL that parseURL accepted.
func (c *Client) protocol(u *url.URL) protocol {
	if p, ok := protocols[u.Scheme]; ok {
		return p(c)
	}
	return httpProtocol{c} // parseURL refused every other scheme
}

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

// httpProtocol speaks HTTP(S) and WebDAV.
type httpProtocol struct{ c *Client }

func (h httpProtocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	missing := Info{Size: -1}
	resp, err := h.c.do(ctx, http.MethodHead, e.raw, nil)
	if err != nil {
		return missing, remoteError(ctx, op, e.raw, err, 0)
	}
	discard(resp)
	if err := checkStatus(resp, http.MethodHead); isMissing(err) {
		return missing, nil
	} else if err != nil {
		return missing, remoteError(ctx, op, e.raw, err, 0)
	}
	return Info{Exists: true, Size: resp.ContentLength, Checksum: digestChecksum(resp.Header)}, nil
}

func (h httpProtocol) remove(ctx context.Context, op string, e endpoint) error {
	resp, err := h.c.do(ctx, http.MethodDelete, e.raw, nil)
	if err != nil {
		return remoteError(ctx, op, e.raw, err, 0)
	}
	discard(resp)
	if err := checkStatus(resp, http.MethodDelete); err != nil && !isMissing(err) {
		return remoteError(ctx, op, e.raw, err, 0)
	}
	return nil
}

func (h httpProtocol) makeParents(ctx context.Context, _ string, e endpoint) error {
	return h.c.makeCollections(ctx, e.raw, e.url)
}

func (h httpProtocol) open(ctx context.Context, e endpoint) (*source, error) {
	return h.c.openHTTP(ctx, e)
}

func (h httpProtocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, _ CopyOptions) (int64, *Error) {
	return h.c.copyToHTTP(ctx, in, p, src, dst.raw)
}

// s3Protocol speaks S3 (s3.go).
type s3Protocol struct{ c *Client }

func (s s3Protocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	return s.c.s3Stat(ctx, op, e.raw, e.url)
}
func (s s3Protocol) remove(ctx context.Context, op string, e endpoint) error {
	return s.c.s3Delete(ctx, op, e.raw, e.url)
}
func (s3Protocol) makeParents(context.Context, string, endpoint) error { return nil } // no directories
func (s s3Protocol) open(ctx context.Context, e endpoint) (*source, error) {
	return s.c.s3Open(ctx, e.raw, e.url)
}
func (s s3Protocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, _ CopyOptions) (int64, *Error) {
	return s.c.copyToS3(ctx, in, p, src, dst.raw, dst.url)
}

// xrootdProtocol speaks xrootd (xrootd.go).
type xrootdProtocol struct{ c *Client }

func (x xrootdProtocol) stat(ctx context.Context, op string, e endpoint) (Info, error) {
	return x.c.xrdStat(ctx, op, e.raw, e.url)
}
func (x xrootdProtocol) remove(ctx context.Context, op string, e endpoint) error {
	return x.c.xrdDelete(ctx, op, e.raw, e.url)
}
func (x xrootdProtocol) makeParents(ctx context.Context, op string, e endpoint) error {
	return x.c.xrdMakeParents(ctx, op, e.raw, e.url)
}
func (x xrootdProtocol) open(ctx context.Context, e endpoint) (*source, error) {
	return x.c.xrdOpen(ctx, e.raw, e.url)
}
func (x xrootdProtocol) write(ctx context.Context, in *source, p *pump, src string, dst endpoint, _ CopyOptions) (int64, *Error) {
	return x.c.copyToXrootd(ctx, in, p, src, dst.raw, dst.url)
}

func (f fileProtocol) rename(ctx context.Context, op, from, _ string, fu, tu *url.URL) error {
	if err := f.c.files.Rename(fu.Path, tu.Path); err != nil {
		return localError(ctx, op, from, err)
	}
	return nil
}

// rename is WebDAV's MOVE (dav, davs).
func (h httpProtocol) rename(ctx context.Context, op, from, to string, _, _ *url.URL) error {
	return h.c.davMove(ctx, op, from, to)
}

// rename is never asked: S3 objects appear whole, in place.
func (s3Protocol) rename(_ context.Context, op, from, _ string, _, _ *url.URL) error {
	return &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: from, Err: errors.New("S3 objects are not renamed")}
}

func (x xrootdProtocol) rename(ctx context.Context, op, from, _ string, fu, tu *url.URL) error {
	return x.c.xrdRename(ctx, op, from, fu, tu)
}
