package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/wire"
)

// Tenant isolation of the ranged and layered operations (RETRIEVE_RANGES,
// PREPARE_RETRIEVE_LAYERS, LAYER_WAIT, STORE_LAYER) against a real
// `kvtier serve` with a disk tier: tenant beta reads none of alpha's
// bytes, whether alpha's chunks are in RAM or only on disk, and can
// neither wait on nor notice layers of a lease someone else holds.

var (
	alphaLayered = chunk.Scope{Model: "llama", WorldSize: 1, Format: layerScope.Format, Namespace: "alpha"}
	betaLayered  = chunk.Scope{Model: "llama", WorldSize: 1, Format: layerScope.Format, Namespace: "beta/one"}
)

// tenantDiskConf is a daemon in dir with RAM, a disk tier and the two
// tenants of tenant_proc_test.go, for the layered scope (16-token chunks
// of 64 KiB).
func tenantDiskConf(dir string) string {
	return fmt.Sprintf(`chunk_size: 16
max_local_cpu_size: 0.0625
local_disk: %s
max_local_disk_size: 0.0625
admin_token: %s
tcp_token: %s
tenants:
  - name: alpha
    token: %s
    namespaces: [alpha]
  - name: beta
    token: %s
    namespaces: ["beta/*"]
`, filepath.Join(dir, "disk"), tAdmin, tTCP, tAlpha, tBeta)
}

// wholeRanges asks for every byte of n chunks, in two ranges each (the
// first layer's K span, then the rest), as a layerwise reader would.
func wholeRanges(n int) []wire.ByteRange {
	var rs []wire.ByteRange
	for j := range n {
		rs = append(rs, wire.ByteRange{Key: uint32(j), From: 0, To: layerSpan},
			wire.ByteRange{Key: uint32(j), From: layerSpan, To: pChunkBytes})
	}
	return rs
}

func zeroed(dst [][]byte) bool {
	for _, b := range dst {
		for _, x := range b {
			if x != 0 {
				return false
			}
		}
	}
	return true
}

// alphaReadsBack checks, with alpha's token over TCP, that RETRIEVE_RANGES
// and RETRIEVE return exactly data for tokens.
func alphaReadsBack(t *testing.T, p *proc, tokens []uint32, data [][]byte, when string) {
	t.Helper()
	ctx := context.Background()
	alpha := mustDial(t, p, false, tAlpha)
	h, err := alpha.Scope(ctx, alphaLayered)
	if err != nil {
		t.Fatal(err)
	}
	n := len(data)
	dst := make([][]byte, n)
	for j := range dst {
		dst[j] = make([]byte, pChunkBytes)
	}
	sizes, read, err := alpha.RetrieveRanges(ctx, client.Tokens(h, tokens, 0), wholeRanges(n), dst)
	if err != nil || len(sizes) != n || read != 2*n {
		t.Fatalf("%s: alpha's RETRIEVE_RANGES: sizes %v, %d ranges, %v; want %d chunks", when, sizes, read, err, n)
	}
	for j := range data {
		if !bytes.Equal(dst[j], data[j]) {
			t.Fatalf("%s: alpha's chunk %d read by ranges differs from what it stored", when, j)
		}
		clear(dst[j])
	}
	if got, _, err := alpha.Retrieve(ctx, client.Tokens(h, tokens, 0), dst); err != nil || got != n {
		t.Fatalf("%s: alpha's RETRIEVE: %d %v", when, got, err)
	}
	for j := range data {
		if !bytes.Equal(dst[j], data[j]) {
			t.Fatalf("%s: alpha's chunk %d read whole differs from what it stored", when, j)
		}
	}
}

// alphaOnDisk checks with alpha's token that its two chunks of tokens
// are cached, none of them in RAM.
func alphaOnDisk(t *testing.T, p *proc, tokens []uint32, when string) {
	t.Helper()
	ctx := context.Background()
	alpha := mustDial(t, p, false, tAlpha)
	h, err := alpha.Scope(ctx, alphaLayered)
	if err != nil {
		t.Fatal(err)
	}
	r, err := alpha.Lookup(ctx, client.Tokens(h, tokens, 0), 0)
	if err != nil || r.Chunks != 2 || len(r.ByTier) != 2 || r.ByTier[0] != 0 || r.ByTier[1] != 2 {
		t.Fatalf("%s: alpha's LOOKUP: %+v %v; want its 2 chunks on disk only", when, r, err)
	}
}

// betaCannotRead runs beta's attempts at alpha's chunks on one connection
// and checks the answer to each, and that the connection still serves
// beta afterwards.
func betaCannotRead(t *testing.T, p *proc, local bool, tokens []uint32, raw []chunk.Key, when string) {
	t.Helper()
	ctx := context.Background()
	where := fmt.Sprintf("%s, %s", when, map[bool]string{false: "TCP", true: "local socket"}[local])
	beta := mustDial(t, p, local, tBeta)
	if beta.Local() {
		t.Fatalf("%s: beta's connection was given the arena", where)
	}
	if _, err := beta.Scope(ctx, alphaLayered); !client.IsStatus(err, wire.StatusUnauthorized) {
		t.Fatalf("%s: beta opens alpha's scope: %v; want UNAUTHORIZED", where, err)
	}
	n := len(raw)
	dst := make([][]byte, n)
	for j := range dst {
		dst[j] = make([]byte, pChunkBytes)
	}
	// alpha's keys named raw (scope id and hash): refused before any
	// lookup, the connection stays open.
	if sizes, read, err := beta.RetrieveRanges(ctx, client.Raw(raw), wholeRanges(n), dst); !client.IsStatus(err, wire.StatusUnauthorized) || sizes != nil || read != 0 {
		t.Fatalf("%s: beta's RETRIEVE_RANGES of alpha's raw keys: sizes %v, %d ranges, %v; want UNAUTHORIZED", where, sizes, read, err)
	}
	if err := beta.Ping(ctx); err != nil {
		t.Fatalf("%s: beta's connection after the refusal: %v", where, err)
	}
	// alpha's prompt, and alpha's chunk hashes, in beta's own scope: the
	// keys differ (the namespace is part of them), so nothing is found.
	hb, err := beta.Scope(ctx, betaLayered)
	if err != nil {
		t.Fatalf("%s: beta opens its own scope: %v", where, err)
	}
	hashes := make([]chunk.Hash, n)
	for j, k := range raw {
		hashes[j] = k.Hash
	}
	for _, k := range []wire.Keys{client.Tokens(hb, tokens, 0), client.Hashes(hb, hashes)} {
		sizes, read, err := beta.RetrieveRanges(ctx, k, wholeRanges(n), dst)
		if err != nil || len(sizes) != 0 || read != 0 {
			t.Fatalf("%s: beta's RETRIEVE_RANGES of alpha's chunks in its own scope (kind %d): sizes %v, %d ranges, %v; want a miss", where, k.Kind, sizes, read, err)
		}
	}
	// Layerwise reads need the arena, which no tenant gets: refused
	// before the keys are looked at, whatever they name.
	for _, k := range []wire.Keys{client.Raw(raw), client.Tokens(hb, tokens, 0)} {
		if sl, err := beta.PrepareRetrieveLayers(ctx, k, 0, 0, 60_000); !client.IsStatus(err, wire.StatusUnsupported) || len(sl.Slots) != 0 {
			t.Fatalf("%s: beta's PREPARE_RETRIEVE_LAYERS (kind %d): %+v %v; want UNSUPPORTED", where, k.Kind, sl, err)
		}
	}
	if !zeroed(dst) {
		t.Fatalf("%s: some of alpha's bytes reached beta's buffers", where)
	}
	if err := beta.Ping(ctx); err != nil {
		t.Fatalf("%s: beta's connection after its attempts: %v", where, err)
	}
}

// TestTenantRangesIsolationProcess: alpha stores two layered chunks; beta,
// over TCP and the local socket, tries RETRIEVE_RANGES (raw keys, its own
// scope with alpha's prompt and alpha's hashes) and PREPARE_RETRIEVE_LAYERS
// while they are in RAM, and again after a restart when they are only on
// disk (before alpha opens its scope again, when they are no tenant's,
// and after). beta gets UNAUTHORIZED for the raw keys, a miss in its own
// scope, UNSUPPORTED for the layered read, never a byte; alpha reads its
// chunks back byte-exact each time.
func TestTenantRangesIsolationProcess(t *testing.T) {
	dir := t.TempDir()
	conf := tenantDiskConf(dir)
	p := startProc(t, dir, conf)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	alpha := mustDial(t, p, false, tAlpha)
	ha, err := alpha.Scope(ctx, alphaLayered)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(2*pChunkTokens, 61)
	data := [][]byte{chunkData(0, 61, pChunkBytes), chunkData(1, 61, pChunkBytes)}
	if n, err := alpha.Store(ctx, client.Tokens(ha, tokens, 0), data); err != nil || n != 2 {
		t.Fatalf("alpha stores: %d %v", n, err)
	}
	if rep, err := alpha.Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("alpha's FLUSH: %+v %v", rep, err)
	}
	// Each chunk is listed once per tier holding it (RAM and disk).
	var raw []chunk.Key
	for _, k := range rawKeys(t, adminKeys(t, p, tAdmin, "")) {
		if !slices.Contains(raw, k) {
			raw = append(raw, k)
		}
	}
	if len(raw) != 2 {
		t.Fatalf("the admin token lists %d keys; want alpha's 2", len(raw))
	}
	for _, local := range []bool{false, true} {
		betaCannotRead(t, p, local, tokens, raw, "in RAM")
	}
	alphaReadsBack(t, p, tokens, data, "in RAM, after beta's attempts")

	p.kill()
	p = startProc(t, dir, conf)
	// The restarted daemon's RAM is empty: the chunks are on disk only.
	for _, local := range []bool{false, true} {
		betaCannotRead(t, p, local, tokens, raw, "on disk, scope not reopened")
	}
	// alpha opens its scope again (the chunks become its own) and looks
	// them up, which reads nothing: they stay on disk only.
	alphaOnDisk(t, p, tokens, "after the restart")
	for _, local := range []bool{false, true} {
		betaCannotRead(t, p, local, tokens, raw, "on disk, scope reopened")
	}
	alphaOnDisk(t, p, tokens, "after beta's attempts on disk")
	alphaReadsBack(t, p, tokens, data, "on disk, after beta's attempts")
}

// TestTenantLayerLeasesProcess: leases on alpha's chunks, held by alpha's
// own connection (a LOOKUP lease) and by a connection with the TCP token on
// the local socket (a layered retrieve and a layered store in alpha's
// namespace), are beyond beta's reach on TCP and on the local socket:
// LAYER_WAIT and RELEASE answer NOT_FOUND, and a STORE_LAYER notice for
// the store lease is dropped (the connection stays open, nothing is
// written early: the store's layers all read back as committed after a
// restart, and the disk tier saved no record by layers).
func TestTenantLayerLeasesProcess(t *testing.T) {
	dir := t.TempDir()
	conf := tenantDiskConf(dir)
	p := startProc(t, dir, conf)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	alpha := mustDial(t, p, false, tAlpha)
	ha, err := alpha.Scope(ctx, alphaLayered)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(2*pChunkTokens, 71)
	data := [][]byte{chunkData(0, 71, pChunkBytes), chunkData(1, 71, pChunkBytes)}
	if n, err := alpha.Store(ctx, client.Tokens(ha, tokens, 0), data); err != nil || n != 2 {
		t.Fatalf("alpha stores: %d %v", n, err)
	}
	look, err := alpha.Lookup(ctx, client.Tokens(ha, tokens, 0), 60_000)
	if err != nil || look.Chunks != 2 || look.Lease == 0 {
		t.Fatalf("alpha's LOOKUP with a lease: %+v %v", look, err)
	}

	full := mustDial(t, p, true, tTCP)
	if !full.Local() {
		t.Fatal("the TCP token's local connection got no arena")
	}
	hf, err := full.Scope(ctx, alphaLayered)
	if err != nil {
		t.Fatal(err)
	}
	lay, err := full.PrepareRetrieveLayers(ctx, client.Tokens(hf, tokens, 0), 0, 0, 60_000)
	if err != nil || len(lay.Slots) != 2 || lay.Lease == 0 {
		t.Fatalf("PREPARE_RETRIEVE_LAYERS of alpha's chunks: %+v %v", lay, err)
	}
	lay.Slots = slices.Clone(lay.Slots) // the client's next call reuses the reply's slices
	for j, s := range lay.Slots {
		if b, _ := full.Slot(s); !bytes.Equal(b, data[j]) {
			t.Fatalf("alpha's chunk %d read layer by layer: wrong bytes", j)
		}
	}
	// A layered store in alpha's namespace, its slots holding a pattern
	// the real bytes replace before the commit: a notice of beta's that
	// were honoured would write that pattern to disk for good.
	stored := prompt(2*pChunkTokens, 72)
	slots, want := prepareLayered(t, full, hf, stored, 72)
	for _, s := range slots.Slots {
		b, err := full.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = 0xEE
		}
	}

	for _, local := range []bool{false, true} {
		where := map[bool]string{false: "TCP", true: "local socket"}[local]
		beta := mustDial(t, p, local, tBeta)
		for _, lease := range []uint64{look.Lease, lay.Lease, slots.Lease} {
			if r, err := beta.LayerWait(ctx, lease, 0); !client.IsStatus(err, wire.StatusNotFound) {
				t.Fatalf("%s: beta's LAYER_WAIT on lease %d: %+v %v; want NOT_FOUND", where, lease, r, err)
			}
		}
		for layer := range layerCount {
			for _, geom := range [][2]int{{0, 0}, {layerCount, 2}} {
				if err := beta.StoreLayer(ctx, slots.Lease, layer, geom[0], geom[1]); err != nil {
					t.Fatalf("%s: beta's STORE_LAYER: %v", where, err)
				}
			}
		}
		// STORE_LAYER is never answered: the PING's reply is the PING's,
		// and it comes after the daemon handled every notice before it.
		if err := beta.Ping(ctx); err != nil {
			t.Fatalf("%s: beta's connection after its STORE_LAYER notices: %v", where, err)
		}
		for _, lease := range []uint64{look.Lease, lay.Lease, slots.Lease} {
			if err := beta.Release(ctx, lease); !client.IsStatus(err, wire.StatusNotFound) {
				t.Fatalf("%s: beta's RELEASE of lease %d: %v; want NOT_FOUND", where, lease, err)
			}
		}
	}

	// Every lease is still its holder's.
	if r, err := full.LayerWait(ctx, lay.Lease, layerCount-1); err != nil || r.Usable != 2 {
		t.Fatalf("LAYER_WAIT of the lease's holder after beta's attempts: %+v %v", r, err)
	}
	for j, s := range lay.Slots {
		if b, _ := full.Slot(s); !bytes.Equal(b, data[j]) {
			t.Fatalf("alpha's chunk %d read layer by layer after beta's attempts: wrong bytes", j)
		}
	}
	if err := full.Release(ctx, lay.Lease); err != nil {
		t.Fatalf("the holder's RELEASE: %v", err)
	}
	if err := alpha.Release(ctx, look.Lease); err != nil {
		t.Fatalf("alpha's RELEASE of its LOOKUP lease: %v", err)
	}
	for j, s := range slots.Slots {
		b, err := full.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, want[j])
	}
	if n, err := full.CommitStore(ctx, slots.Lease, 2); err != nil || n != 2 {
		t.Fatalf("commit: %d %v", n, err)
	}
	if rep, err := full.Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH: %+v %v", rep, err)
	}
	raw, err := full.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Queues []struct {
			LayerSaved uint64 `json:"layer_saved"`
			LayerBytes uint64 `json:"layer_bytes"`
		} `json:"queues"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || len(st.Queues) != 1 {
		t.Fatalf("STATS queues: %+v %v", st.Queues, err)
	}
	if q := st.Queues[0]; q.LayerSaved != 0 || q.LayerBytes != 0 {
		t.Fatalf("the disk tier saved %d records and %d bytes by layers: beta's notices were honoured", q.LayerSaved, q.LayerBytes)
	}

	// After a restart both prompts come from disk, byte-exact.
	p.kill()
	p = startProc(t, dir, conf)
	alphaReadsBack(t, p, tokens, data, "after the restart")
	alphaReadsBack(t, p, stored, want, "the layered store, after the restart")
}
