package transfer

import (
	"context"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// kernelChunk is how much one copy_file_range call moves: the fence and
// the context are asked, and progress told, between calls.
const kernelChunk = 16 << 20

// kernelCopy copies a local source into the file dst inside the kernel,
// without its bytes passing through Sluice: a reflink (FICLONE, which
// shares the blocks on btrfs, XFS and the like) where the file system
// allows it, else copy_file_range. It is for copies that compute no
// checksum; the source's bounds are kept as the pump keeps them. handled
// is false when the kernel cannot copy these files (nothing was written:
// the pump copies instead).
func (p *pump) kernelCopy(ctx context.Context, in *source, dst *os.File) (n int64, failed side, err error, handled bool) {
	src, bounds := localFile(in)
	if src == nil {
		return 0, sideNone, nil, false
	}
	fence, _ := ctx.Value(fenceKey{}).(Fence)
	ask := func() (side, error) {
		if err := ctx.Err(); err != nil {
			return sideContext, err
		}
		if fence != nil {
			if err := fence(); err != nil {
				return sideFence, err
			}
		}
		return sideNone, nil
	}
	if s, err := ask(); err != nil {
		return 0, s, err, true
	}
	if bounds.want >= 0 {
		if size, ok := reflink(src, dst); ok {
			bounds.read = size
			if limit := bounds.limit(); limit >= 0 && size > limit {
				return size, sideSource, bounds.tooMuch(), true
			}
			if err := bounds.end(); err != nil {
				return size, sideSource, err, true
			}
			return size, sideNone, nil, true
		}
	}
	last := time.Now()
	for first := true; ; first = false {
		if !first { // asked above before the first
			if s, err := ask(); err != nil {
				return n, s, err, true
			}
		}
		chunk := int64(kernelChunk)
		if limit := bounds.limit(); limit >= 0 {
			if left := limit - bounds.read; left < chunk {
				chunk = left
			}
			if chunk == 0 {
				if err := bounds.probe(); err != io.EOF {
					return n, sideSource, err, true
				}
				return n, sideNone, nil, true
			}
		}
		var moved int
		var cerr error
		if err := control(src, dst, func(s, d int) {
			for {
				moved, cerr = unix.CopyFileRange(s, nil, d, nil, int(chunk), 0)
				if cerr != unix.EINTR {
					return
				}
			}
		}); err != nil {
			cerr = err
		}
		if cerr != nil {
			if n == 0 {
				return 0, sideNone, nil, false // not between these files: the pump copies
			}
			return n, sideDestination, cerr, true
		}
		if moved == 0 && n == 0 && bounds.read < bounds.want {
			// Nothing copied yet where bytes are due: some file systems
			// answer 0 rather than an error; the pump copies instead.
			return 0, sideNone, nil, false
		}
		n += int64(moved)
		bounds.read += int64(moved)
		if moved == 0 {
			if err := bounds.end(); err != nil {
				return n, sideSource, err, true
			}
			return n, sideNone, nil, true
		}
		if p.progress != nil {
			if now := time.Now(); now.Sub(last) >= p.every {
				last = now
				p.progress(n)
			}
		}
	}
}

// reflink makes dst share src's blocks (FICLONE) and returns the size
// copied; ok is false when the file system cannot (tmpfs, ext4, or two
// file systems), and then nothing was written.
func reflink(src, dst *os.File) (size int64, ok bool) {
	var cerr error
	if err := control(src, dst, func(s, d int) { cerr = unix.IoctlFileClone(d, s) }); err != nil || cerr != nil {
		return 0, false
	}
	fi, err := dst.Stat()
	if err != nil {
		return 0, false
	}
	return fi.Size(), true
}

// control runs f with the descriptors of src and dst.
func control(src, dst *os.File, f func(s, d int)) error {
	sc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	dc, err := dst.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	if err := sc.Control(func(s uintptr) {
		inner = dc.Control(func(d uintptr) { f(int(s), int(d)) })
	}); err != nil {
		return err
	}
	return inner
}
