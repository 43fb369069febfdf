package client

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/wire"
)

// The prefill/decode transfer operations (docs/disaggregation.md).

// Push asks the daemon to send the chunks k names (after the skip), which
// it must hold, to the daemon at dest under transfer id; timeoutMS bounds
// the whole transfer (0: the daemon's default). Calls with the same id add
// chunks in order; last says none follow. It returns how many chunks the
// transfer has queued in all.
func (c *Client) Push(ctx context.Context, id uint64, dest string, k wire.Keys, timeoutMS uint32, last bool) (int, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	m := wire.Push{Transfer: id, TimeoutMS: timeoutMS, Last: last, Dest: dest, Keys: k}
	_, body, err := c.roundTrip(m.Append(b), wire.OpPush, 0)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("PUSH reply of %d bytes", len(body)))
	}
	return int(binary.LittleEndian.Uint32(body)), nil
}

// PushStatus returns where transfer id stands on the daemon pushing it.
// An id the daemon does not know (never pushed, or ended long ago) is a
// NOT_FOUND StatusError.
func (c *Client) PushStatus(ctx context.Context, id uint64) (wire.PushStatusReply, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.PushStatusReply{}, err
	}
	defer c.end()
	m := wire.PushStatus{Transfer: id}
	_, body, err := c.roundTrip(m.Append(b), wire.OpPushStatus, 0)
	if err != nil {
		return wire.PushStatusReply{}, err
	}
	var r wire.PushStatusReply
	if err := r.Decode(body); err != nil {
		return r, c.breakConn(err)
	}
	return r, nil
}

// Wait blocks until at least least of the chunks k names (after the
// skip; 0 means all of them) are in the daemon's RAM, as a leading run,
// or timeoutMS passes, and returns how many leading ones are there. Give
// the context a deadline beyond timeoutMS.
func (c *Client) Wait(ctx context.Context, k wire.Keys, least, timeoutMS uint32) (wire.WaitReply, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.WaitReply{}, err
	}
	defer c.end()
	m := wire.Wait{TimeoutMS: timeoutMS, MinChunks: least, Keys: k}
	_, body, err := c.roundTrip(m.Append(b), wire.OpWait, 0)
	if err != nil {
		return wire.WaitReply{}, err
	}
	var r wire.WaitReply
	if err := r.Decode(body); err != nil {
		return r, c.breakConn(err)
	}
	return r, nil
}

// Receive sends chunks[j] under keys[j] to the daemon as part of transfer
// id; the daemon keeps them in RAM for up to holdMS or until they are
// read. Each chunk's checksum follows its bytes: sums[j] when sums is not
// nil (a test sends wrong ones), else the wire.Checksum of chunks[j],
// computed piece by piece as its bytes are written.
// It returns how many leading chunks the daemon stored. This is what one
// daemon sends another; a connector uses Push.
func (c *Client) Receive(ctx context.Context, id uint64, holdMS uint32, keys []chunk.Key, chunks [][]byte, sums []uint64) (int, error) {
	if (sums != nil && len(chunks) != len(sums)) || len(chunks) > len(keys) {
		return 0, fmt.Errorf("kvtier client: %d chunks, %d checksums, %d keys", len(chunks), len(sums), len(keys))
	}
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	c.sizes = c.sizes[:0]
	for j, ch := range chunks {
		if len(ch) > wire.MaxChunkBody-wire.ChecksumSize {
			return 0, fmt.Errorf("kvtier client: chunk %d of %d bytes, limit %d", j, len(ch), wire.MaxChunkBody-wire.ChecksumSize)
		}
		c.sizes = append(c.sizes, uint32(len(ch)))
	}
	m := wire.Receive{Transfer: id, HoldMS: holdMS, Keys: wire.Keys{Kind: wire.KindRaw, Raw: keys[:len(chunks)]}, Sizes: c.sizes}
	flags := wire.Flags(0)
	if len(chunks) > 0 {
		flags = wire.FlagMore
	}
	c.out = wire.Finish(m.Append(b), wire.OpReceive, flags, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return 0, c.breakConn(err)
	}
	for j, ch := range chunks {
		flags := wire.FlagMore
		if j == len(chunks)-1 {
			flags = 0
		}
		if err := c.writeSummed(wire.OpReceive, flags, ch, sums, j); err != nil {
			return 0, c.breakConn(err)
		}
	}
	_, body, err := c.readReply(wire.OpReceive)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("RECEIVE reply of %d bytes", len(body)))
	}
	return int(binary.LittleEndian.Uint32(body)), nil
}

// writeSummed writes one RECEIVE (or RECEIVE_LAYERS) data frame: the header, the bytes, then
// the checksum trailer. Unless the checksum is given, the bytes go out in
// steps of hashStep, each hashed just before it is written, so the kernel
// copies it from the CPU's cache instead of reading memory a second time.
func (c *Client) writeSummed(op wire.Op, flags wire.Flags, data []byte, sums []uint64, j int) error {
	wire.Header{Len: uint32(len(data) + wire.ChecksumSize), Op: op, Flags: flags, ID: c.id}.Put(c.hdr[:])
	step := len(data)
	if sums == nil {
		step = min(step, hashStep)
		if c.hasher == nil {
			c.hasher = xxh3.New()
		}
		c.hasher.Reset()
	}
	head := c.hdr[:]
	for off := 0; off < len(data) || head != nil; {
		piece := data[off : off+min(step, len(data)-off)]
		if sums == nil {
			c.hasher.Write(piece)
		}
		c.vec[0], c.vec[1] = head, piece
		c.bufs = c.vec[:]
		if _, err := c.bufs.WriteTo(c.conn); err != nil {
			return err
		}
		head, off = nil, off+len(piece)
	}
	var sum uint64
	if sums != nil {
		sum = sums[j]
	} else {
		sum = c.hasher.Sum64()
	}
	binary.LittleEndian.PutUint64(c.hdr[:wire.ChecksumSize], sum)
	_, err := c.conn.Write(c.hdr[:wire.ChecksumSize])
	return err
}

// hashStep is the size of the pieces writeSummed hashes and writes. 4 MiB
// rather than 1 MiB: a quarter of the write system calls and wake-ups,
// which BenchmarkPushLarge (server) showed cost more than the cache
// misses of hashing a piece that no longer fits in L2.
const hashStep = 4 << 20
