package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"go-hep.org/x/hep/xrootd"
	"go-hep.org/x/hep/xrootd/xrdfs"
	"go-hep.org/x/hep/xrootd/xrdproto"
)

// xrootd URLs are root://host[:port]//absolute/path, read and written
// with go-hep's client. The user name sent at login is "sluice".

// xrdPath returns the server path of a root:// URL.
func xrdPath(u *url.URL) string { return path.Clean("/" + u.Path) }

// xrdConnect opens a connection to an xrootd server for one operation.
// Connections are not kept: go-hep's client panics in a goroutine of its
// own when a server closes a connection it holds, so a connection lives
// only as long as the operation that needs it.
//
// go-hep's client dials with a net.Dialer of its own, which takes no
// Control function. So the host is resolved here, its addresses checked
// by the Guard, and the client given the address chosen, not the name:
// the name is not resolved again (no DNS rebinding), and the client's
// further connections (its sub-sessions) go to that address too. A
// redirect that the server answers with (kXR_redirect) is followed by
// go-hep to wherever it points, unchecked: the one way past the Guard
// (see docs/operations.md, "Outbound connections").
func (c *Client) xrdConnect(ctx context.Context, u *url.URL) (*xrootd.Client, error) {
	port, err := strconv.ParseUint(portOf(u), 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", u.Port(), err)
	}
	addr, err := c.guard.resolve(ctx, u.Hostname(), uint16(port), false)
	if err != nil {
		return nil, err
	}
	return xrootd.NewClient(ctx, addr.String(), "sluice")
}

// xrdCloseWait is how long xrdClose waits for go-hep's client to close.
const xrdCloseWait = 10 * time.Second

// xrdClose closes a connection, waiting at most xrdCloseWait. go-hep's
// Client.Close can block for ever: its multiplexer, holding its lock, hands
// a pending request's channel an answer no one reads, while the goroutine
// that would read it waits for that lock. By then the operation's outcome
// is known, so it is not held up: the close goes on in the background, and
// its goroutine and connection are lost only in that case.
func xrdClose(cli *xrootd.Client) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		cli.Close()
	}()
	select {
	case <-done:
	case <-time.After(xrdCloseWait):
	}
}

// xrdError classifies an xrootd failure: "not found" and "not authorized"
// as the HTTP statuses 404 and 403 would be, other server errors as 503.
func xrdError(ctx context.Context, op, rawURL string, _ *url.URL, err error, moved int64) *Error {
	var se xrdproto.ServerError
	if errors.As(err, &se) {
		code := http.StatusServiceUnavailable
		switch {
		case isXrdMissing(err):
			code = http.StatusNotFound
		case se.Code == xrdproto.NotAuthorized:
			code = http.StatusForbidden
		}
		return remoteError(ctx, op, rawURL, fmt.Errorf("%w: %s", &StatusError{Code: code, Status: fmt.Sprintf("xrootd error %d", se.Code)}, se.Message), moved)
	}
	return remoteError(ctx, op, rawURL, err, moved)
}

// isXrdMissing reports a missing path: kXR_NotFound, or kXR_IOError with
// the system's "no such file or directory", which go-hep's server sends.
func isXrdMissing(err error) bool {
	var se xrdproto.ServerError
	return errors.As(err, &se) && (se.Code == xrdproto.NotFound ||
		se.Code == xrdproto.IOError && strings.Contains(se.Message, "no such file or directory"))
}

func (c *Client) xrdStat(ctx context.Context, op, rawURL string, u *url.URL) (Info, error) {
	missing := Info{Size: -1}
	cli, err := c.xrdConnect(ctx, u)
	if err != nil {
		return missing, xrdError(ctx, op, rawURL, u, err, 0)
	}
	defer xrdClose(cli)
	st, err := cli.FS().Stat(ctx, xrdPath(u))
	if isXrdMissing(err) {
		return missing, nil
	}
	if err != nil {
		return missing, xrdError(ctx, op, rawURL, u, err, 0)
	}
	if st.IsDir() {
		return missing, remoteError(ctx, op, rawURL, &StatusError{Code: http.StatusConflict, Status: "is a directory"}, 0)
	}
	return Info{Exists: true, Size: st.Size()}, nil
}

func (c *Client) xrdDelete(ctx context.Context, op, rawURL string, u *url.URL) error {
	cli, err := c.xrdConnect(ctx, u)
	if err != nil {
		return xrdError(ctx, op, rawURL, u, err, 0)
	}
	defer xrdClose(cli)
	if err := cli.FS().RemoveFile(ctx, xrdPath(u)); err != nil && !isXrdMissing(err) {
		return xrdError(ctx, op, rawURL, u, err, 0)
	}
	return nil
}

func (c *Client) xrdMakeParents(ctx context.Context, op, rawURL string, u *url.URL) error {
	cli, err := c.xrdConnect(ctx, u)
	if err != nil {
		return xrdError(ctx, op, rawURL, u, err, 0)
	}
	defer xrdClose(cli)
	mode := xrdfs.OpenModeOwnerRead | xrdfs.OpenModeOwnerWrite | xrdfs.OpenModeOwnerExecute |
		xrdfs.OpenModeGroupRead | xrdfs.OpenModeGroupExecute | xrdfs.OpenModeOtherRead | xrdfs.OpenModeOtherExecute
	if err := cli.FS().MkdirAll(ctx, path.Dir(xrdPath(u)), mode); err != nil {
		return xrdError(ctx, op, rawURL, u, err, 0)
	}
	return nil
}

// xrdReader reads a remote file from start to end.
type xrdReader struct {
	ctx  context.Context
	cli  *xrootd.Client
	f    xrdfs.File
	off  int64
	size int64
}

func (r *xrdReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if rest := r.size - r.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := r.f.ReadAtContext(r.ctx, p, r.off)
	r.off += int64(n)
	if err == nil && n == 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *xrdReader) Close() error {
	err := r.f.Close(context.WithoutCancel(r.ctx))
	xrdClose(r.cli)
	return err
}

func (c *Client) xrdOpen(ctx context.Context, rawURL string, u *url.URL) (*source, error) {
	const op = "copy"
	info, err := c.xrdStat(ctx, op, rawURL, u)
	if err != nil {
		return nil, err
	}
	if !info.Exists {
		return nil, sourceNotFound(ctx, rawURL, "xrootd: not found")
	}
	cli, err := c.xrdConnect(ctx, u)
	if err != nil {
		return nil, xrdError(ctx, op, rawURL, u, err, 0)
	}
	f, err := cli.FS().Open(ctx, xrdPath(u), xrdfs.OpenModeOwnerRead, xrdfs.OpenOptionsOpenRead)
	if err != nil {
		xrdClose(cli)
		return nil, xrdError(ctx, op, rawURL, u, err, 0)
	}
	return &source{body: &xrdReader{ctx: ctx, cli: cli, f: f, size: info.Size}, size: info.Size}, nil
}

// xrdWriter writes a remote file from start to end.
type xrdWriter struct {
	ctx context.Context
	f   xrdfs.File
	off int64
}

func (w *xrdWriter) Write(p []byte) (int, error) {
	if err := w.f.WriteAtContext(w.ctx, p, w.off); err != nil {
		return 0, err
	}
	w.off += int64(len(p))
	return len(p), nil
}

// copyToXrootd writes the source to a root:// URL, replacing what is there,
// and removes it again on failure.
func (c *Client) copyToXrootd(ctx context.Context, in *source, p *pump, src, dst string, u *url.URL) (int64, *Error) {
	const op = "copy"
	cli, err := c.xrdConnect(ctx, u)
	if err != nil {
		return 0, xrdError(ctx, op, dst, u, err, 0)
	}
	defer xrdClose(cli)
	f, err := cli.FS().Open(ctx, xrdPath(u), xrdfs.OpenModeOwnerRead|xrdfs.OpenModeOwnerWrite|xrdfs.OpenModeGroupRead|xrdfs.OpenModeOtherRead,
		xrdfs.OpenOptionsDelete|xrdfs.OpenOptionsMkPath|xrdfs.OpenOptionsOpenUpdate)
	if err != nil {
		return 0, xrdError(ctx, op, dst, u, err, 0)
	}
	n, side, err := p.run(ctx, in.body, &xrdWriter{ctx: ctx, f: f})
	var failure *Error
	switch {
	case side == sideFence:
		_ = f.Close(context.WithoutCancel(ctx))
		return n, fenceError(op, dst, err)
	case ctx.Err() != nil:
		failure = cancelled(ctx, op, src)
	case side == sideSource:
		failure = sourceError(ctx, in, src, err, n)
	case err != nil:
		failure = xrdError(ctx, op, dst, u, err, n)
	}
	cctx := context.WithoutCancel(ctx)
	if err := f.Close(cctx); err != nil && failure == nil {
		failure = xrdError(ctx, op, dst, u, err, n)
	}
	if failure != nil && mayAct(ctx) {
		_ = c.xrdDelete(cctx, op, dst, u)
	}
	return n, failure
}

// xrdRename moves from to to on one xrootd server (mv), replacing to.
func (c *Client) xrdRename(ctx context.Context, op, rawURL string, from, to *url.URL) error {
	cli, err := c.xrdConnect(ctx, from)
	if err != nil {
		return xrdError(ctx, op, rawURL, from, err, 0)
	}
	defer xrdClose(cli)
	if err := cli.FS().Rename(ctx, xrdPath(from), xrdPath(to)); err != nil {
		return xrdError(ctx, op, rawURL, from, err, 0)
	}
	return nil
}

// no directories
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

func (x xrootdProtocol) rename(ctx context.Context, op, from, _ string, fu, tu *url.URL) error {
	return x.c.xrdRename(ctx, op, from, fu, tu)
}
