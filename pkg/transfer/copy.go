package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// CopyOptions tune Copy. The zero value computes adler32 with a 1 MiB
// buffer and reports progress every second if Progress is set.
type CopyOptions struct {
	// ChecksumTypes are computed while streaming, e.g. {"adler32"} or
	// {"adler32", "md5"}; empty means adler32, unless NoChecksum.
	ChecksumTypes []string
	// NoChecksum, with no ChecksumTypes, computes none, except the type
	// of a checksum the source states (its Digest), which is checked. A
	// local file copied to a local file is then copied by the kernel
	// (a reflink where the file system shares blocks, else
	// copy_file_range), its bytes never read into Sluice.
	NoChecksum bool
	// Progress, if set, is called with the bytes moved so far at most every
	// ProgressEvery, and once at the end, from the goroutine calling Copy.
	Progress func(bytes int64)
	// ProgressEvery defaults to 1 s.
	ProgressEvery time.Duration
	// BufferSize is the size of each read; default 1 MiB. Copy holds two
	// such buffers so that hashing overlaps reading and writing.
	BufferSize int
	// Sync makes Copy flush a file destination to stable storage (fsync)
	// before returning.
	Sync bool
	// ExpectedSize, if > 0, is the size the source had when it was queried:
	// the copy must move exactly that many bytes. A source that gives
	// fewer, or more (reading stops at the first byte too many), fails with
	// "size changed: the source had N bytes when queried, ..." as a
	// TEMPORARY_REMOTE error of the source (see bounds.go), local files
	// included; one that says up front it has another size fails before
	// any byte moves.
	ExpectedSize int64
	// MaxSize, if > 0, is the largest source allowed. One that says up
	// front it is larger, or whose ExpectedSize is, is refused before any
	// byte moves; one of unknown size is cut off at the first byte past
	// it. Both are PERMANENT_REMOTE errors of the source (LOCAL_FILE for a
	// local one).
	MaxSize int64
}

// CopyResult describes a copy. On failure Bytes, Started and Ended are
// still set.
type CopyResult struct {
	// Bytes is the number of bytes written to the destination.
	Bytes int64
	// Checksums maps each requested type to "type:value" of the bytes
	// moved. It is nil on failure.
	Checksums map[string]string
	// SourceChecksum is "type:value" from the source's Digest header, if it
	// sent one. Copy computes that type too and fails if the bytes moved
	// do not have it.
	SourceChecksum string
	Started, Ended time.Time
}

const (
	defaultBufferSize    = 1 << 20
	defaultProgressEvery = time.Second
	// How long to try removing a partial HTTP destination, shorter when
	// the copy was cancelled so that Copy still returns promptly.
	cleanupTimeout          = 5 * time.Second
	cleanupTimeoutCancelled = time.Second
)

// buffers recycles default-sized copy buffers (two halves of
// defaultBufferSize, see pump) between copies.
var buffers = sync.Pool{New: func() any { b := make([]byte, 2*defaultBufferSize); return &b }}

// Copy streams src to dst, computing the requested checksums on the way.
//
// A file:// dst is written exactly where it says (pass a name from TempURL
// and Rename it once the copy is verified), creating parent directories.
// An http(s):// dst is written with PUT, streaming the body, with
// Content-Length set when the source's size is known.
//
// On failure Copy removes whatever it wrote of dst. For HTTP it sends
// DELETE, unless the server answered the PUT with a 3xx or 4xx status: then
// nothing was stored and an existing object is left alone. PUT redirects
// are not followed, as a streamed body cannot be sent twice. When ctx is
// cancelled Copy returns promptly with an error wrapping ctx.Err().
func (c *Client) Copy(ctx context.Context, src, dst string, opt CopyOptions) (res CopyResult, err error) {
	const op = "copy"
	res.Started = time.Now()
	defer func() { res.Ended = time.Now() }()

	su, err := parseURL(op, src)
	if err != nil {
		return res, err
	}
	du, err := parseURL(op, dst)
	if err != nil {
		return res, err
	}
	types := opt.ChecksumTypes
	if len(types) == 0 && !opt.NoChecksum {
		types = []string{"adler32"}
	}
	sums, err := newHashSet(types)
	if err != nil {
		return res, &Error{Kind: dtr.ErrInternalLogic, Op: op, URL: dst, Err: err}
	}
	buf, release := copyBuffer(opt.BufferSize)
	defer release()
	err = c.copy(ctx, endpoint{src, su}, endpoint{dst, du}, opt, sums, buf, &res)
	return res, err
}

// endpoint is a URL as given and parsed. The given form is used for
// requests and messages.
type endpoint struct {
	raw string
	url *url.URL
}

// copyBuffer returns a buffer for two reads of size bytes (see pump) and a
// function to call when it is no longer used.
func copyBuffer(size int) (buf []byte, release func()) {
	if size <= 0 || size == defaultBufferSize {
		bp := buffers.Get().(*[]byte)
		return *bp, func() { buffers.Put(bp) }
	}
	return make([]byte, 2*size), func() {}
}

// copy is Copy once the URLs are parsed and the hashes and buffer made. It
// sets res.Bytes, res.SourceChecksum and, on success, res.Checksums.
func (c *Client) copy(ctx context.Context, src, dst endpoint, opt CopyOptions, sums *hashSet, buf []byte, res *CopyResult) error {
	// Stop the source request too if the destination fails.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	in, err := c.openSource(ctx, src)
	if err != nil {
		return err
	}
	defer in.body.Close()
	if failure := bound(ctx, in, src.raw, opt); failure != nil {
		return failure // refused before any byte moved
	}
	res.SourceChecksum = in.checksum
	stated, _, _ := strings.Cut(in.checksum, ":")
	if stated != "" {
		_ = sums.add(stated) // a Digest gives only types Sluice has
	}

	sums.inline = in.size >= 0 && in.size <= inlineHashMax
	sums.start()
	defer sums.stop()
	p := &pump{buf: buf, sums: sums, progress: opt.Progress, every: opt.ProgressEvery}
	if p.every <= 0 {
		p.every = defaultProgressEvery
	}
	// Nothing is written for a grant that may be another worker's now;
	// the pump asks the fence again before every write.
	if e := fenced(ctx, "copy", dst.raw); e != nil {
		return e
	}
	var failure *Error
	res.Bytes, failure = c.protocol(dst.url).write(ctx, in, p, src.raw, dst, opt)
	if opt.Progress != nil {
		opt.Progress(res.Bytes)
	}
	if failure != nil {
		return failure
	}
	res.Checksums = sums.result()
	if got := res.Checksums[stated]; stated != "" && got != in.checksum {
		// Damaged on the way, or the source changed: what was written goes.
		if e := fenced(ctx, "copy", dst.raw); e != nil {
			return e
		}
		if err := c.protocol(dst.url).remove(ctx, "copy", dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &Error{Kind: dtr.ErrTemporaryRemote, Op: "copy", URL: dst.raw, Err: fmt.Errorf("remove a copy whose checksum is wrong: %w", err)}
		}
		res.Checksums = nil
		return &Error{Kind: dtr.ErrTemporaryRemote, Op: "copy", URL: src.raw,
			Err: fmt.Errorf("the bytes received have checksum %s, the source's Digest says %s", got, in.checksum)}
	}
	return nil
}

// source is an open copy source.
type source struct {
	body     io.ReadCloser
	size     int64 // -1 if unknown
	checksum string
	local    bool
}

// openSource opens the source with its protocol. A missing source is
// LOCAL_FILE for files and PERMANENT_REMOTE ("source not found: HTTP 404")
// elsewhere.
func (c *Client) openSource(ctx context.Context, src endpoint) (*source, error) {
	return c.protocol(src.url).open(ctx, src)
}

// sourceError classifies a failure reading the source after moved bytes.
func sourceError(ctx context.Context, in *source, rawURL string, err error, moved int64) *Error {
	const op = "copy"
	if failure := boundsError(ctx, in, rawURL, err); failure != nil {
		return failure // too long, too short or too large (bounds.go)
	}
	if in.local {
		return localError(ctx, op, rawURL, fmt.Errorf("read source: %w", err))
	}
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) && in.size >= 0:
		err = fmt.Errorf("short body: got %d of %d bytes: %w", moved, in.size, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("short body: cut after %d bytes: %w", moved, err)
	default:
		err = fmt.Errorf("read source: %w", err)
	}
	return remoteError(ctx, op, rawURL, err, moved)
}

// side says which end of a pump failed.
type side int

const (
	sideNone side = iota
	sideSource
	sideDestination
	sideContext
	// sideFence: the fence refused the next write (fence.go).
	sideFence
)

// pump moves bytes from a reader to a writer through the hashes. Its
// buffer is split in two halves used in turn, so that a chunk is hashed
// while it is written and while the next chunk is read.
type pump struct {
	buf      []byte
	sums     *hashSet
	progress func(int64)
	every    time.Duration
}

// run copies r to w until EOF, checking ctx between reads and the fence
// of ctx, if any, before every write. It returns the bytes written and, on
// failure, which side failed. All hashing is done when it returns.
func (p *pump) run(ctx context.Context, r io.Reader, w io.Writer) (n int64, failed side, err error) {
	half := len(p.buf) / 2
	bufs := [2][]byte{p.buf[:half], p.buf[half:]}
	hashing := false // the previous chunk, in the other half, is being hashed
	defer func() {
		if hashing {
			p.sums.wait()
		}
	}()
	last := time.Now()
	fence, _ := ctx.Value(fenceKey{}).(Fence)
	for i := 0; ; i ^= 1 {
		if err := ctx.Err(); err != nil {
			return n, sideContext, err
		}
		nr, rerr := r.Read(bufs[i])
		if fence != nil {
			// Asked after the read, which may have waited long (a
			// process frozen, a stalled source), and before the write.
			if err := fence(); err != nil {
				return n, sideFence, err
			}
		}
		if hashing {
			p.sums.wait()
			hashing = false
		}
		if nr > 0 {
			chunk := bufs[i][:nr]
			p.sums.begin(chunk)
			hashing = true
			nw, werr := w.Write(chunk)
			n += int64(nw)
			if werr == nil && nw < nr {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return n, sideDestination, werr
			}
			if p.progress != nil {
				if now := time.Now(); now.Sub(last) >= p.every {
					last = now
					p.progress(n)
				}
			}
		}
		if rerr == io.EOF {
			return n, sideNone, nil
		}
		if rerr != nil {
			return n, sideSource, rerr
		}
	}
}
