package ingest

import (
	"encoding/binary"
	"testing"

	"kvtier/internal/msgpacktest"
)

// The fixtures below build vLLM's wire format independently of kvevents'
// decoder, with a general msgpack library configured as vLLM's msgspec
// encoder behaves (compact integers).

// omap and field build msgspec-ordered maps; see package msgpacktest.
type (
	omap  = msgpacktest.Map
	field = msgpacktest.Field
)

// encoding selects one of the two event encodings vLLM has used.
type encoding int

const (
	tagged encoding = iota // ["BlockStored", ...] arrays, older releases
	mapped                 // {"type": "BlockStored", ...}, mid-2026 on
)

func (e encoding) String() string {
	if e == tagged {
		return "tagged"
	}
	return "map"
}

var encodings = []encoding{tagged, mapped}

// stored is a BlockStored event; medium nil means GPU.
func stored(enc encoding, medium any, hashes ...uint64) any {
	tokens := make([]uint32, 4*len(hashes))
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	if enc == tagged {
		return []any{"BlockStored", hashes, nil, tokens, 4, nil, medium}
	}
	m := omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"token_ids", tokens}, {"block_size", 4}}
	if medium != nil {
		m = append(m, field{"medium", medium})
	}
	return m
}

func removed(enc encoding, medium any, hashes ...uint64) any {
	if enc == tagged {
		return []any{"BlockRemoved", hashes, medium}
	}
	m := omap{{"type", "BlockRemoved"}, {"block_hashes", hashes}}
	if medium != nil {
		m = append(m, field{"medium", medium})
	}
	return m
}

func cleared(enc encoding) any {
	if enc == tagged {
		return []any{"AllBlocksCleared"}
	}
	return omap{{"type", "AllBlocksCleared"}}
}

// batch encodes an EventBatch for DP rank 0.
func batch(t testing.TB, enc encoding, events ...any) []byte {
	t.Helper()
	if events == nil {
		events = []any{}
	}
	var v any = []any{1700000000.5, events, 0}
	if enc == mapped {
		v = omap{{"ts", 1700000000.5}, {"events", events}, {"data_parallel_rank", 0}}
	}
	b, err := msgpacktest.Encode(v, true)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func frames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), seqFrame(seq), payload}
}
