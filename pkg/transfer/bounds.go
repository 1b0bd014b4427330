package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// The bounds of a copy (CopyOptions.ExpectedSize and MaxSize), and the
// size a source stated when opened, are enforced by reading the
// source through a boundedReader. Its failures are the source's, with
// these kinds:
//
//   - A source whose size is not the one found when it was queried (or,
//     for a local file, when it was opened) is TEMPORARY_REMOTE, retried,
//     local files included: it was most likely still being written or
//     being replaced, which a later attempt, which queries the size again,
//     outlives. Another replica is tried first, if there is one. (A local
//     file is otherwise LOCAL_FILE, not retried; but a file that changes
//     under the reader is not a fault of the site that a retry cannot
//     mend, and the next attempt finds its new size.)
//   - A source larger than MaxSize is refused for good: PERMANENT_REMOTE,
//     or LOCAL_FILE for a local one, as every other refusal of a source.
//     The limit does not change between attempts, nor would the file.

// sizeError is a source whose size is not the one it was known to have.
type sizeError struct {
	// known is the size the source had "when queried" or "when opened".
	known int64
	when  string
	// read is what was read; more says the read stopped when a byte past
	// known arrived, and now, if >= 0, the size the source gave when
	// opened, before any byte moved.
	read int64
	more bool
	now  int64
}

func (e *sizeError) Error() string {
	switch {
	case e.now >= 0:
		return fmt.Sprintf("size changed: the source had %d bytes %s, it has %d now", e.known, e.when, e.now)
	case e.more:
		return fmt.Sprintf("size changed: the source had %d bytes %s, more were read (the copy stopped at byte %d)", e.known, e.when, e.read)
	}
	return fmt.Sprintf("size changed: the source had %d bytes %s, %d were read", e.known, e.when, e.read)
}

// tooLargeError is a source larger than the maximum file size.
type tooLargeError struct {
	max int64
	// size is the source's size if it was known before any byte moved,
	// else -1 and read is where the copy stopped.
	size, read int64
}

func (e *tooLargeError) Error() string {
	if e.size >= 0 {
		return fmt.Sprintf("the source has %d bytes, more than the maximum file size of %d bytes", e.size, e.max)
	}
	return fmt.Sprintf("the source is larger than the maximum file size of %d bytes (the copy stopped at byte %d)", e.max, e.read)
}

// CheckMaxSize refuses a source of a known size above max (> 0): the
// PERMANENT_REMOTE, or for a file:// URL LOCAL_FILE, error that Copy gives
// with that MaxSize, for op. A size of -1 (unknown) or a max of 0 passes.
func CheckMaxSize(op, rawURL string, size, max int64) error {
	if max <= 0 || size <= max {
		return nil
	}
	u, err := parseURL(op, rawURL)
	if err != nil {
		return err
	}
	return &Error{Kind: tooLargeKind(u.Scheme == "file"), Op: op, URL: rawURL, Err: &tooLargeError{max: max, size: size}}
}

func tooLargeKind(local bool) dtr.ErrorKind {
	if local {
		return dtr.ErrLocalFile
	}
	return dtr.ErrPermanentRemote
}

// bound checks the size the source gave when opened against opt, before
// any byte moves, and wraps its body so that the bytes read are checked
// too. It returns a source error, or nil.
func bound(ctx context.Context, in *source, src string, opt CopyOptions) *Error {
	fail := func(err error) *Error { return boundsError(ctx, in, src, err) }
	if opt.MaxSize > 0 {
		if in.size > opt.MaxSize {
			return fail(&tooLargeError{max: opt.MaxSize, size: in.size})
		}
		if opt.ExpectedSize > opt.MaxSize {
			return fail(&tooLargeError{max: opt.MaxSize, size: opt.ExpectedSize})
		}
	}
	r := &boundedReader{r: in.body, want: -1, max: opt.MaxSize}
	switch {
	case opt.ExpectedSize > 0 && in.size >= 0 && in.size != opt.ExpectedSize:
		return fail(&sizeError{known: opt.ExpectedSize, when: "when queried", now: in.size})
	case opt.ExpectedSize > 0:
		r.want, r.when = opt.ExpectedSize, "when queried"
	case in.size >= 0:
		// Also without a queried size, a source must give the size it
		// stated when opened (a local file must keep it); reading stops a
		// byte past it.
		r.want, r.when = in.size, "when opened"
	}
	if r.want < 0 && r.max <= 0 {
		return nil
	}
	in.body = r
	return nil
}

// boundsError classifies a failure of a boundedReader, or returns nil if
// err is not one.
func boundsError(ctx context.Context, in *source, src string, err error) *Error {
	const op = "copy"
	var se *sizeError
	var te *tooLargeError
	switch {
	case !errors.As(err, &se) && !errors.As(err, &te):
		return nil
	case ctx.Err() != nil:
		return cancelled(ctx, op, src)
	case se != nil:
		return &Error{Kind: dtr.ErrTemporaryRemote, Op: op, URL: src, Err: err}
	}
	return &Error{Kind: tooLargeKind(in.local), Op: op, URL: src, Err: err}
}

// boundedReader reads a source that must give exactly want bytes (if
// want >= 0) and at most max (if max > 0). Past the last byte allowed it
// reads one more to see whether the source ends there, and fails if it
// does not: an overlong or endless source is never read to its end.
type boundedReader struct {
	r    io.ReadCloser
	want int64
	when string
	max  int64
	read int64
}

// limit is the most bytes the source may give: want, else max; -1 for
// no limit.
func (b *boundedReader) limit() int64 {
	switch {
	case b.want >= 0:
		return b.want
	case b.max > 0:
		return b.max
	}
	return -1
}

func (b *boundedReader) Read(p []byte) (int, error) {
	limit := b.want
	if limit < 0 {
		limit = b.max
	}
	if left := limit - b.read; int64(len(p)) > left {
		if left == 0 {
			return 0, b.probe()
		}
		p = p[:left]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	if err == io.EOF {
		err = b.end()
	}
	return n, err
}

// probe reads one byte past the limit: the source should end there.
func (b *boundedReader) probe() error {
	var one [1]byte
	for {
		n, err := b.r.Read(one[:])
		switch {
		case n > 0:
			b.read++
			return b.tooMuch()
		case err == io.EOF:
			return b.end()
		case err != nil:
			return err
		}
	}
}

// end is the error at the source's end: io.EOF if it gave what it should.
func (b *boundedReader) end() error {
	if b.want >= 0 && b.read != b.want {
		return &sizeError{known: b.want, when: b.when, read: b.read, now: -1}
	}
	return io.EOF
}

// tooMuch is the error once a byte past the limit arrived.
func (b *boundedReader) tooMuch() error {
	if b.want >= 0 {
		return &sizeError{known: b.want, when: b.when, read: b.read, more: true, now: -1}
	}
	return &tooLargeError{max: b.max, size: -1, read: b.read}
}

func (b *boundedReader) Close() error { return b.r.Close() }

// localFile returns the file a local source reads and the bounds it is
// read within (none, if bound set none), or nil for a source that is not
// a local file.
func localFile(in *source) (*os.File, *boundedReader) {
	switch body := in.body.(type) {
	case *os.File:
		return body, &boundedReader{r: body, want: -1}
	case *boundedReader:
		if f, ok := body.r.(*os.File); ok {
			return f, body
		}
	}
	return nil, nil
}
