package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/engine"
	"kvtier/internal/s3test"
	"kvtier/tier"
)

// The layered fixture's chunks: 4 layers × 2 parts of 4096 bytes.
const (
	s3Layers = 4
	s3Span   = 4096
)

// s3Fixture stores 4 layered chunks on disk and in a real S3 server
// (versitygw), then removes the chunks from of disk on, so that chunks
// from on are in S3 only.
func s3Fixture(t *testing.T, from int) (*s3test.Server, *engine.Engine, []chunk.Key, [][]byte) {
	t.Helper()
	srv := s3test.Start(t)
	e, keys, chunks := layeredFixture(t, srv.URL("kvc", "p/")+"&layer_ranges=true", 4)
	disk := e.Manager().Tiers()[1]
	for _, k := range keys[from:] {
		tier.Remove(disk, k)
	}
	if len(chunks[0]) != 2*s3Layers*s3Span {
		t.Fatalf("chunks of %d bytes", len(chunks[0]))
	}
	return srv, e, keys, chunks
}

// s3Object is the file versitygw keeps k's object in.
func s3Object(srv *s3test.Server, k chunk.Key) string {
	return srv.ObjectPath("kvc", fmt.Sprintf("p/%016x%x", k.Scope, k.Hash[:]))
}

// TestLayerwiseS3 reads a prefix held only in S3 layer by layer: after
// LayerWait(i) layer i's K and V hold the stored bytes in every chunk;
// the objects are pieced (the chunk's bytes after the piece table), and the
// chunks become RAM chunks with their bytes.
func TestLayerwiseS3(t *testing.T) {
	srv, e, keys, chunks := s3Fixture(t, 0)
	obj, err := os.ReadFile(s3Object(srv, keys[0]))
	if err != nil {
		t.Fatal(err)
	}
	if len(obj) != codec.PiecedHeaderSize+len(chunks[0]) || !bytes.Equal(obj[codec.PiecedHeaderSize:], chunks[0]) {
		t.Fatalf("object of %d bytes: not a pieced object of the chunk", len(obj))
	}
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 4 {
		t.Fatalf("PrepareRetrieveLayers: %d slots, %v", len(slots), err)
	}
	defer e.Release(id)
	for layer := range s3Layers {
		usable, ready, err := e.LayerWait(ctx, id, layer)
		if err != nil || usable != 4 || ready <= layer {
			t.Fatalf("LayerWait(%d) = %d usable, %d ready, %v", layer, usable, ready, err)
		}
		for c, s := range slots {
			b := slotBytes(t, e, s)
			for _, off := range []int{layer * s3Span, (s3Layers + layer) * s3Span} {
				if !bytes.Equal(b[off:off+s3Span], chunks[c][off:off+s3Span]) {
					t.Fatalf("layer %d of chunk %d: wrong bytes at %d", layer, c, off)
				}
			}
		}
	}
	waitDone(t, e, keys, 4)
	for c, s := range slots {
		if !bytes.Equal(slotBytes(t, e, s), chunks[c]) {
			t.Fatalf("chunk %d holds wrong bytes", c)
		}
	}
}

// TestLayerwiseS3DamagedPiece damages layer 2's K span of chunk 2 in the
// S3 server's own file: the piece fails its checksum, so chunk 2 and 3 are
// unusable (the connector recomputes them) and never become RAM chunks,
// while chunks 0 and 1 load with their bytes.
func TestLayerwiseS3DamagedPiece(t *testing.T) {
	srv, e, keys, chunks := s3Fixture(t, 0)
	path := s3Object(srv, keys[2])
	obj, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj[codec.PiecedHeaderSize+2*s3Span+7] ^= 0x20
	if err := os.WriteFile(path, obj, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 4 {
		t.Fatalf("PrepareRetrieveLayers: %d slots, %v", len(slots), err)
	}
	defer e.Release(id)
	usable, _, err := e.LayerWait(ctx, id, s3Layers-1)
	if err != nil || usable != 2 {
		t.Fatalf("LayerWait = %d usable, %v; want 2", usable, err)
	}
	for c := range 2 {
		if !bytes.Equal(slotBytes(t, e, slots[c]), chunks[c]) {
			t.Fatalf("chunk %d holds wrong bytes", c)
		}
	}
	waitDone(t, e, keys, 2)
	time.Sleep(50 * time.Millisecond)
	for c, k := range keys {
		if e.InRAM(k) != (c < 2) {
			t.Fatalf("chunk %d in RAM: %v", c, e.InRAM(k))
		}
	}
}

// TestLayerwiseS3KilledMidStream keeps chunks 0 and 1 on disk and 2 and 3
// in S3 only, and kills versitygw once the lease is granted: the disk
// chunks are usable with their bytes; the S3 chunks are reported unusable
// (whatever layers of them had arrived) and never committed.
func TestLayerwiseS3KilledMidStream(t *testing.T) {
	srv, e, keys, chunks := s3Fixture(t, 2)
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 4 {
		t.Fatalf("PrepareRetrieveLayers: %d slots, %v", len(slots), err)
	}
	defer e.Release(id)
	srv.Kill()
	usable, ready, err := e.LayerWait(ctx, id, s3Layers-1)
	if err != nil || ready != s3Layers || usable < 2 || usable > 4 {
		t.Fatalf("LayerWait = %d usable, %d ready, %v", usable, ready, err)
	}
	for c := range usable {
		if !bytes.Equal(slotBytes(t, e, slots[c]), chunks[c]) {
			t.Fatalf("usable chunk %d holds wrong bytes", c)
		}
	}
	waitDone(t, e, keys, usable)
	for c, k := range keys {
		if e.InRAM(k) != (c < usable) {
			t.Fatalf("chunk %d in RAM: %v with %d usable", c, e.InRAM(k), usable)
		}
	}
}

// TestLayerwiseS3WholeByDefault: without layer_ranges in its URL an S3
// tier is read a whole chunk at a time, so the first layer a chunk has is
// all of them: LayerWait(0) answers with every layer ready, the bytes are
// the stored ones, and the chunks become RAM chunks.
func TestLayerwiseS3WholeByDefault(t *testing.T) {
	srv := s3test.Start(t)
	e, keys, chunks := layeredFixture(t, srv.URL("kvc", "w/"), 4)
	disk := e.Manager().Tiers()[1]
	for _, k := range keys {
		tier.Remove(disk, k)
	}
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 4 {
		t.Fatalf("PrepareRetrieveLayers: %d slots, %v", len(slots), err)
	}
	defer e.Release(id)
	usable, ready, err := e.LayerWait(ctx, id, 0)
	if err != nil || usable != 4 || ready != s3Layers {
		t.Fatalf("LayerWait(0) = %d usable, %d ready, %v; want 4 usable, all %d layers (whole reads)", usable, ready, err, s3Layers)
	}
	for c, s := range slots {
		if !bytes.Equal(slotBytes(t, e, s), chunks[c]) {
			t.Fatalf("chunk %d holds wrong bytes", c)
		}
	}
	waitDone(t, e, keys, 4)
}
