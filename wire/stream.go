package wire

import (
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
// sent. Growth past SmallBody is charged to Budget when one is set, and
// Shrink gives a large buffer (and its charge) back between requests.
type Reader struct {
	r   io.Reader
	hdr [HeaderSize]byte
	buf []byte
	// Budget, when set, is asked for every byte of body buffer beyond
	// SmallBody before it is allocated and told when it is released; an
	// error from Take ends the read with that error.
	Budget  Budget
	charged int // bytes of buf's capacity charged to Budget
}

// Budget bounds the memory that large metadata bodies hold across many
// readers (the daemon's connections).
type Budget interface {
	Take(n int) error
	Give(n int)
}

// SmallBody is the body buffer a Reader keeps between frames without
// charging it to a Budget; most requests fit in it.
const SmallBody = 64 << 10

// NewReader returns a Reader of r. Wrap r in a bufio.Reader if frames are
// small and frequent; chunk bytes bypass such a buffer anyway once they are
// larger than it.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

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
	for len(r.buf) < n {
		step := min(n-len(r.buf), max(SmallBody, len(r.buf)))
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

// grow makes buf's capacity at least n, charging the Budget for the part
// beyond SmallBody.
func (r *Reader) grow(n int) error {
	if cap(r.buf) >= n {
		return nil
	}
	// The charge is always the capacity beyond SmallBody.
	if need := n - SmallBody - r.charged; r.Budget != nil && need > 0 {
		if err := r.Budget.Take(need); err != nil {
			return err
		}
		r.charged += need
	}
	nb := make([]byte, len(r.buf), max(n, 4096))
	copy(nb, r.buf)
	r.buf = nb
	return nil
}

// Shrink drops a body buffer grown past SmallBody, returning its charge to
// the Budget: a connection that once sent a large body does not keep
// holding its memory while idle.
func (r *Reader) Shrink() {
	if cap(r.buf) <= SmallBody {
		return
	}
	r.buf = nil
	if r.charged > 0 {
		r.Budget.Give(r.charged)
		r.charged = 0
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
