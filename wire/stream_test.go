package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// countingPool lends buffers and counts what is out.
type countingPool struct {
	out, max int
	fail     bool
}

func (p *countingPool) Get(n int) ([]byte, error) {
	if p.fail {
		return nil, errors.New("no buffer")
	}
	p.out++
	p.max = max(p.max, p.out)
	return make([]byte, 0, n), nil
}

func (p *countingPool) Put([]byte) { p.out-- }

// stalledBody is a header announcing size bytes followed by only sent of
// them, then the end of the stream.
func stalledBody(size uint32, sent int) []byte {
	b := make([]byte, HeaderSize+sent)
	Header{Len: size, Op: OpPing}.Put(b)
	return b
}

// TestBodyGrowsWithWhatArrives checks that a body announced large but cut
// short never makes the reader allocate the announced size.
func TestBodyGrowsWithWhatArrives(t *testing.T) {
	for _, pool := range []*countingPool{nil, {}} {
		r := NewReader(bytes.NewReader(stalledBody(MaxMetaBody, 1000)))
		if pool != nil {
			r.Pool = pool
		}
		h, err := r.Header()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Body(h); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("a body cut short: %v, want ErrUnexpectedEOF", err)
		}
		if c := cap(r.buf); c > 2*SmallBody {
			t.Errorf("pool %v: buffer of %d bytes for 1000 that arrived", pool != nil, c)
		}
	}
}

// TestBodyLargeFromPool reads a large body whole and checks it came from
// the pool, that at most two buffers were out at once (the one being
// outgrown and its successor), and that Shrink gave everything back.
func TestBodyLargeFromPool(t *testing.T) {
	want := bytes.Repeat([]byte("kvtier"), 500_000)
	frame := Finish(append(Begin(nil), want...), OpPing, 0, 1, StatusOK)
	pool := &countingPool{}
	r := NewReader(bytes.NewReader(frame))
	r.Pool = pool
	h, body, err := r.Next()
	if err != nil || h.Len != uint32(len(want)) || !bytes.Equal(body, want) {
		t.Fatalf("Next: %v, %d bytes, equal %v", err, len(body), bytes.Equal(body, want))
	}
	if pool.out != 1 || pool.max > 2 {
		t.Errorf("%d buffers out after the read, at most %d at once; want 1 and 2", pool.out, pool.max)
	}
	r.Shrink()
	if pool.out != 0 || r.buf != nil {
		t.Errorf("after Shrink %d buffers are still out", pool.out)
	}
}

// TestBodyPoolRefusal passes a pool's error through, as the read's error.
func TestBodyPoolRefusal(t *testing.T) {
	r := NewReader(bytes.NewReader(stalledBody(1<<20, 1<<20)))
	r.Pool = &countingPool{fail: true}
	h, _ := r.Header()
	if _, err := r.Body(h); err == nil || err.Error() != "no buffer" {
		t.Fatalf("Body with a refusing pool: %v", err)
	}
}

// FuzzReader reads frames from arbitrary bytes, as the daemon reads a
// connection: no input may panic, and a body is never longer than its
// header says.
func FuzzReader(f *testing.F) {
	f.Add(Finish(append(Begin(nil), "ping"...), OpPing, 0, 1, StatusOK))
	f.Add(stalledBody(MaxMetaBody, 10))
	f.Add(stalledBody(MaxMetaBody+1, 0))
	f.Add(append(stalledBody(3, 3), stalledBody(70_000, 70_000)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		r.Pool = &countingPool{}
		for range 8 {
			h, body, err := r.Next()
			if err != nil {
				return
			}
			if len(body) != int(h.Len) {
				t.Fatalf("body of %d bytes for a header of %d", len(body), h.Len)
			}
			r.Shrink()
		}
	})
}
