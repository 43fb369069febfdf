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

// readPiece is how much of a payload readRecord reads before it publishes
// progress. The caller checksums each piece while the next one is read, so
// only the last piece's checksum is left once the I/O ends; 4 MiB requests
// still keep the device as busy as one large request does (measured: the
// same rate for a 32 MiB record read whole or in 4 MiB pieces).
const readPiece = 4 << 20

// readRecord reads the record at off whose payload fills dst exactly,
// leaving its header block in w.hdr. Like writePayload it reads straight into
// dst unless O_DIRECT cannot use dst's memory. It reads the payload in
// pieces and publishes to filled how much of dst holds its final bytes after
// each one.
func (w *worker) readRecord(fd int, direct bool, off int64, dst []byte, filled *progress) error {
	if direct && !aligned(dst) {
		return w.readRecordBounced(fd, off, dst, filled)
	}
	defer w.clearIOV()
	bulk := len(dst) &^ (blockSize - 1)
	rest := dst[bulk:]
	w.iov = append(w.iov, w.hdr) // the header comes with the first piece
	at := off
	for pos := 0; ; pos += readPiece {
		end := min(pos+readPiece, bulk)
		if end > pos {
			w.iov = append(w.iov, dst[pos:end])
		}
		last := end == bulk
		if last && len(rest) > 0 {
			w.iov = append(w.iov, w.tail)
		}
		if err := preadvFull(fd, w.iov, at); err != nil {
			return err
		}
		if last {
			copy(rest, w.tail)
			filled.publish(len(dst))
			return nil
		}
		filled.publish(end)
		at = off + blockSize + int64(end)
		w.iov = w.iov[:0]
	}
}

// readRecordBounced is readRecord for memory O_DIRECT cannot use: it stages
// the payload through the bounce buffer, one buffer-full at a time.
func (w *worker) readRecordBounced(fd int, off int64, dst []byte, filled *progress) error {
	if err := preadFull(fd, w.hdr, off); err != nil {
		return err
	}
	off += blockSize
	for pos := 0; pos < len(dst); {
		want := min(len(w.bounce), int(alignUp(int64(len(dst)-pos))))
		if err := preadFull(fd, w.bounce[:want], off); err != nil {
			return err
		}
		pos += copy(dst[pos:], w.bounce[:want])
		off += int64(want)
		filled.publish(pos)
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
	for len(iov) > 0 {
		n, err := unix.Pwritev(fd, iov, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		iov = advance(iov, n)
	}
	return nil
}

// preadvFull fills all of iov from off; hitting the end of the file first is
// io.ErrUnexpectedEOF. It consumes iov.
func preadvFull(fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := unix.Preadv(fd, iov, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
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
