package disk

import (
	"errors"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// worker is one I/O goroutine's scratch space. Every buffer is block
// aligned so it can take part in O_DIRECT transfers, and owned by exactly one
// goroutine, so the hot path needs neither a pool nor a lock.
type worker struct {
	hdr    []byte   // one block: a record's header
	tail   []byte   // one block: a payload's last partial block, zero padded
	bounce []byte   // staging for callers' buffers that O_DIRECT cannot use
	iov    [][]byte // vector for preadv/pwritev, reused
}

func newWorker(bounce int) *worker {
	return &worker{
		hdr:    alignedBuf(blockSize),
		tail:   alignedBuf(blockSize),
		bounce: alignedBuf(int(alignUp(int64(max(bounce, blockSize))))),
		iov:    make([][]byte, 0, 3),
	}
}

// alignedBuf returns n zero bytes starting at a block boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+blockSize)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) & (blockSize - 1)); r != 0 {
		skip = blockSize - r
	}
	return b[skip : skip+n : skip+n]
}

// aligned reports whether O_DIRECT can transfer to or from b's memory.
func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))&(blockSize-1) == 0
}

// writePayload stores a record's payload, zero padded to a whole block,
// after the header block at off. It goes straight from the caller's memory
// in one pwritev (whole blocks, padded tail) whenever the file is buffered
// or the memory is block aligned; otherwise it is staged through the bounce
// buffer. The header is written separately, after the payload: see Put.
func (w *worker) writePayload(fd int, direct bool, off int64, payload []byte) error {
	defer w.clearIOV()
	off += blockSize
	if !direct || aligned(payload) {
		bulk := len(payload) &^ (blockSize - 1)
		if bulk > 0 {
			w.iov = append(w.iov, payload[:bulk])
		}
		if rest := payload[bulk:]; len(rest) > 0 {
			n := copy(w.tail, rest)
			clear(w.tail[n:])
			w.iov = append(w.iov, w.tail)
		}
		return pwritevFull(fd, w.iov, off)
	}
	for pos := 0; pos < len(payload); {
		n := copy(w.bounce, payload[pos:])
		padded := int(alignUp(int64(n)))
		clear(w.bounce[n:padded])
		if err := pwritevFull(fd, append(w.iov[:0], w.bounce[:padded]), off); err != nil {
			return err
		}
		off += int64(padded)
		pos += n
	}
	return nil
}

// readRecord reads part of the payload of the record at off into dst: the
// len(dst) bytes from payload offset from (a block multiple) on, where dst
// ends at a block boundary or at the payload's end. Reading from the start
// (from == 0) takes the header block along into w.hdr, in the same preadv.
// Like writePayload it reads straight into dst unless O_DIRECT cannot use
// dst's memory.
func (w *worker) readRecord(fd int, direct bool, off, from int64, dst []byte) error {
	defer w.clearIOV()
	header := from == 0
	at := off + blockSize + from // where dst's bytes are on disk
	if !direct || aligned(dst) {
		bulk := len(dst) &^ (blockSize - 1)
		rest := dst[bulk:]
		if header { // it sits right before them
			w.iov = append(w.iov, w.hdr)
			at = off
		}
		if bulk > 0 {
			w.iov = append(w.iov, dst[:bulk])
		}
		if len(rest) > 0 {
			w.iov = append(w.iov, w.tail)
		}
		if err := preadvFull(fd, w.iov, at); err != nil {
			return err
		}
		copy(rest, w.tail)
		return nil
	}
	if header {
		if err := preadFull(fd, w.hdr, off); err != nil {
			return err
		}
	}
	for pos := 0; pos < len(dst); {
		want := min(len(w.bounce), int(alignUp(int64(len(dst)-pos))))
		if err := preadFull(fd, w.bounce[:want], at); err != nil {
			return err
		}
		pos += copy(dst[pos:], w.bounce[:want])
		at += int64(want)
	}
	return nil
}

func (w *worker) clearIOV() {
	clear(w.iov[:cap(w.iov)]) // drop references to callers' buffers
	w.iov = w.iov[:0]
}

// writeHeader encodes h into block (one aligned block) and writes it.
func writeHeader(fd int, block []byte, h *header) error {
	h.encode(block)
	for b, off := block, h.off; len(b) > 0; {
		n, err := unix.Pwrite(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// pwritevFull writes all of iov at off, resuming after short writes. It
// consumes iov.
func pwritevFull(fd int, iov [][]byte, off int64) error {
	return vectorFull(unix.Pwritev, io.ErrShortWrite, fd, iov, off)
}

// preadvFull fills all of iov from off; hitting the end of the file first is
// io.ErrUnexpectedEOF. It consumes iov.
func preadvFull(fd int, iov [][]byte, off int64) error {
	return vectorFull(unix.Preadv, io.ErrUnexpectedEOF, fd, iov, off)
}

// vectorFull repeats a vectored transfer until all of iov is done,
// retrying EINTR and resuming after short transfers; a transfer of zero
// bytes is noProgress.
func vectorFull(transfer func(int, [][]byte, int64) (int, error), noProgress error, fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := transfer(fd, iov, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return noProgress
		}
		off += int64(n)
		iov = advance(iov, n)
	}
	return nil
}

// preadFull fills b from off; hitting the end of the file first is
// io.ErrUnexpectedEOF.
func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
		off += int64(n)
	}
	return nil
}

// advance drops the first n bytes from iov, in place.
func advance(iov [][]byte, n int) [][]byte {
	for n > 0 && len(iov) > 0 {
		if n < len(iov[0]) {
			iov[0] = iov[0][n:]
			return iov
		}
		n -= len(iov[0])
		iov = iov[1:]
	}
	return iov
}
