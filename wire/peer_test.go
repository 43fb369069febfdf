package wire

import (
	"slices"
	"testing"
)

func TestPeerDataHeaderRoundTrip(t *testing.T) {
	chunks := [][]byte{[]byte("first chunk"), make([]byte, 1000)}
	m := PeerDataHeader{DataHeader: DataHeader{Tokens: 32, Sizes: []uint32{11, 1000}}}
	for _, c := range chunks {
		m.Sums = append(m.Sums, Checksum(c))
	}
	var got PeerDataHeader
	if err := got.Decode(m.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if got.Tokens != 32 || !slices.Equal(got.Sizes, m.Sizes) || !slices.Equal(got.Sums, m.Sums) {
		t.Fatalf("decoded %+v, want %+v", got, m)
	}
	// Without checksums it is not a peer's reply: a plain DataHeader
	// must not decode as one.
	if err := got.Decode(m.DataHeader.Append(nil)); err == nil {
		t.Fatal("a DataHeader decoded as a PeerDataHeader")
	}
	// One checksum per chunk, no fewer.
	short := m
	short.Sums = m.Sums[:1]
	if err := got.Decode(short.Append(nil)); err == nil {
		t.Fatal("a PeerDataHeader with too few checksums decoded")
	}
	if Checksum(chunks[0]) == Checksum([]byte("first chunK")) {
		t.Fatal("the checksum misses a changed byte")
	}
}
