package wire

import (
	"bufio"
	"fmt"
	"io"
)

// Reader reads frames from a byte stream. Metadata bodies land in one
// buffer that is reused (valid until the next call); chunk bytes are read
// by the caller straight into their destination with ReadData.
//
// The body buffer grows with the bytes that actually arrive, never to a
// length a peer merely announced: a peer that sends a header promising
// 8 MiB and then stalls makes the reader hold nothing more than what it
// sent. Buffers larger than SmallBody come from Pool when one is set, and
// Shrink hands them back between requests.
type Reader struct {
	r   io.Reader
	br  *bufio.Reader // r, when it is one: BodyView reads bodies in place
	hdr [HeaderSize]byte
	buf []byte
	// Pool, when set, lends every body buffer larger than SmallBody; an
	// error from its Get ends the read with that error.
	Pool   Pool
	pooled bool // buf came from Pool
}

// Pool lends the large body buffers of many readers (the daemon's
// connections), so that together they stay within a bound and reuse one
// another's memory. Get returns a buffer with a capacity of at least n, or
// an error; Put takes back a buffer Get returned.
type Pool interface {
	Get(n int) ([]byte, error)
	Put(b []byte)
}

// SmallBody is the largest body buffer a Reader allocates for itself and
// keeps between frames; most requests fit in it.
const SmallBody = 64 << 10

// NewReader returns a Reader of r. Wrap r in a bufio.Reader if frames are
// small and frequent; chunk bytes bypass such a buffer anyway once they are
// larger than it.
func NewReader(r io.Reader) *Reader {
	br, _ := r.(*bufio.Reader)
	return &Reader{r: r, br: br}
}

// Header reads the next frame header.
func (r *Reader) Header() (Header, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Header{}, err
	}
	return ParseHeader(r.hdr[:])
}

// Body reads a metadata body of h.Len bytes, at most MaxMetaBody.
func (r *Reader) Body(h Header) ([]byte, error) {
	if h.Len > MaxMetaBody {
		return nil, fmt.Errorf("%w: %s body of %d bytes, limit %d", ErrTooBig, h.Op, h.Len, MaxMetaBody)
	}
	n := int(h.Len)
	if cap(r.buf) >= n {
		r.buf = r.buf[:n]
		if _, err := io.ReadFull(r.r, r.buf); err != nil {
			return nil, unexpected(err)
		}
		return r.buf, nil
	}
	// Read in steps that double, so the buffer is at most twice what
	// arrived and each byte is copied at most once more on average.
	r.buf = r.buf[:0]
	first := SmallBody
	if r.Pool != nil {
		first = 2 * SmallBody // a body that large is lent from the start
	}
	for len(r.buf) < n {
		step := min(n-len(r.buf), max(first, len(r.buf)))
		if err := r.grow(len(r.buf) + step); err != nil {
			return nil, err
		}
		got := len(r.buf)
		r.buf = r.buf[:got+step]
		if _, err := io.ReadFull(r.r, r.buf[got:]); err != nil {
			r.buf = r.buf[:got]
			return nil, unexpected(err)
		}
	}
	return r.buf, nil
}

// BodyView is Body without the copy when it can be: if the Reader reads
// from a bufio.Reader that already holds the whole body, the body is
// returned where it lies in that buffer. Such a view is valid only until
// the next read of any kind (Header, Body, ReadData), so it is for
// requests that are decoded and answered before the stream is read again;
// otherwise it is Body.
func (r *Reader) BodyView(h Header) ([]byte, error) {
	n := int(h.Len)
	if r.br == nil || h.Len > MaxMetaBody || r.br.Buffered() < n {
		return r.Body(h)
	}
	b, err := r.br.Peek(n)
	if err != nil {
		return nil, unexpected(err)
	}
	r.br.Discard(n)
	return b, nil
}

// grow makes buf's capacity at least n, keeping its contents.
func (r *Reader) grow(n int) error {
	if cap(r.buf) >= n {
		return nil
	}
	var nb []byte
	fromPool := r.Pool != nil && n > SmallBody
	if fromPool {
		b, err := r.Pool.Get(n)
		if err != nil {
			return err
		}
		nb = b[:len(r.buf)]
	} else {
		nb = make([]byte, len(r.buf), max(n, 4096))
	}
	copy(nb, r.buf)
	r.release()
	r.buf, r.pooled = nb, fromPool
	return nil
}

// release hands buf back to the Pool it came from.
func (r *Reader) release() {
	if r.pooled {
		r.Pool.Put(r.buf[:0])
		r.pooled = false
	}
}

// Shrink gives up a body buffer larger than SmallBody (to its Pool, if it
// came from one): a connection that once sent a large body does not keep
// holding its memory while idle.
func (r *Reader) Shrink() {
	if cap(r.buf) > SmallBody {
		r.release()
		r.buf = nil
	}
}

// Next reads a whole metadata frame.
func (r *Reader) Next() (Header, []byte, error) {
	h, err := r.Header()
	if err != nil {
		return h, nil, err
	}
	body, err := r.Body(h)
	return h, body, err
}

// ReadData reads a data frame's body into dst, which must be exactly as
// long as the body: the size was announced before, and a frame that
// disagrees is an error, not a short or long write into dst.
func (r *Reader) ReadData(h Header, dst []byte) error {
	if int64(h.Len) != int64(len(dst)) {
		return fmt.Errorf("%w: data frame of %d bytes where %d were announced", ErrFrame, h.Len, len(dst))
	}
	_, err := io.ReadFull(r.r, dst)
	return unexpected(err)
}

// Discard skips n body bytes.
func (r *Reader) Discard(n uint32) error {
	_, err := io.CopyN(io.Discard, r.r, int64(n))
	return unexpected(err)
}

// unexpected turns an EOF inside a frame into ErrUnexpectedEOF: only a
// stream that ends between frames ends cleanly.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Begin starts a frame in b (reusing its storage): HeaderSize placeholder
// bytes that Finish fills in once the body is appended.
func Begin(b []byte) []byte {
	return append(b[:0], make([]byte, HeaderSize)...)
}

// Finish writes the header of the frame built in b since Begin.
func Finish(b []byte, op Op, flags Flags, id uint32, status Status) []byte {
	Header{Len: uint32(len(b) - HeaderSize), Op: op, Flags: flags, ID: id, Status: status}.Put(b)
	return b
}
