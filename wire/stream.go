package wire

import (
	"fmt"
	"io"
)

// Reader reads frames from a byte stream. Metadata bodies land in one
// buffer that is reused (valid until the next call); chunk bytes are read
// by the caller straight into their destination with ReadData.
type Reader struct {
	r   io.Reader
	hdr [HeaderSize]byte
	buf []byte
}

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
	if cap(r.buf) < int(h.Len) {
		r.buf = make([]byte, h.Len, max(int(h.Len), 4096))
	}
	r.buf = r.buf[:h.Len]
	if _, err := io.ReadFull(r.r, r.buf); err != nil {
		return nil, unexpected(err)
	}
	return r.buf, nil
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
