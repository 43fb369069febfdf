package chunk

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// scopeEncodingVersion is the first byte of a scope's canonical encoding.
// Bump it whenever the encoding below changes: every key changes with it,
// which is the point, since old keys would no longer be reproducible.
const scopeEncodingVersion = 1

// Purposes the scope encoding is hashed for. They are part of the encoded
// bytes so that a scope's ID and its seed are independent hashes, not two
// views of one.
const (
	purposeID   byte = 'I'
	purposeSeed byte = 'S'
)

// ID returns a stable 64-bit id of the scope: xxh3-64 of the scope's
// canonical encoding. It is the same in every process, on every machine of
// either byte order and after restarts; nothing needs to be configured.
func (s Scope) ID() uint64 {
	return xxh3.Hash(s.appendCanonical(nil, purposeID))
}

// Seed returns the root of the scope's hash chain: the value chunk 0 is
// hashed together with. It is xxh3-128 of the scope's canonical encoding
// (with a purpose byte distinct from ID's).
func (s Scope) Seed() Hash {
	return xxh3.Hash128(s.appendCanonical(nil, purposeSeed)).Bytes()
}

// appendCanonical appends the scope's unambiguous encoding:
//
//	version   1 byte  (scopeEncodingVersion)
//	purpose   1 byte  ('I' for ID, 'S' for Seed)
//	Model     uint64 little-endian byte length, then the bytes
//	WorldSize int64 little-endian
//	Rank      int64 little-endian
//	Format    uint64 little-endian byte length, then the bytes
//	Namespace uint64 little-endian byte length, then the bytes
//
// Length prefixes keep ("ab", "c") and ("a", "bc") apart; fixed-width
// integers make the bytes independent of the machine's int size and order.
func (s Scope) appendCanonical(dst []byte, purpose byte) []byte {
	dst = append(dst, scopeEncodingVersion, purpose)
	dst = appendLengthPrefixed(dst, s.Model)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(int64(s.WorldSize)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(int64(s.Rank)))
	dst = appendLengthPrefixed(dst, s.Format)
	dst = appendLengthPrefixed(dst, s.Namespace)
	return dst
}

func appendLengthPrefixed(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(s)))
	return append(dst, s...)
}
