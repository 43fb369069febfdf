package replay

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Kinds of synthetic trace (Synthesize). Each has its own shape of reuse,
// so a policy can be checked on more than one workload.
const (
	// SynthSystem: a few hot system prompts (Zipf popularity, 2 to 16
	// blocks each) in front of one-off user messages of 1 to 6 blocks.
	// Reuse is concentrated on a small set of short prefixes.
	SynthSystem = "system"
	// SynthChat: long multi-turn chats. Each session has on average 8
	// turns; a turn's prompt is the previous prompt, its answer and a new
	// message, so every turn finds the previous one's full blocks. Many
	// sessions are open at once and users think between turns, so a
	// session comes back after hundreds of other requests.
	SynthChat = "chat"
	// SynthRAG: retrieval-augmented prompts: a shared instruction block,
	// then a retrieved document (Zipf over a corpus of 4 to 12 block
	// documents), then a second document and a one-off question. Only
	// the first document's blocks are a shared prefix; what follows it
	// is rarely seen twice.
	SynthRAG = "rag"
)

// SynthKinds lists the kinds Synthesize accepts.
func SynthKinds() []string { return []string{SynthSystem, SynthChat, SynthRAG} }

// Synthesize generates a trace of n requests of the named kind. The same
// kind, seed and n always give the same trace. Prompts are whole blocks
// except the last, and hash ids are prefix-chained as in a real trace.
// Timestamps advance 250 ms per request.
func Synthesize(kind string, seed uint64, n int) ([]Request, error) {
	if n <= 0 {
		return nil, fmt.Errorf("replay: synthetic trace of %d requests", n)
	}
	g := &synth{r: rand.New(rand.NewPCG(seed, 0x73796e7468)), ids: make(map[[2]uint64]uint64)}
	var next func() []uint64
	switch strings.ToLower(kind) {
	case SynthSystem:
		next = g.system()
	case SynthChat:
		next = g.chat()
	case SynthRAG:
		next = g.rag()
	default:
		return nil, fmt.Errorf("replay: unknown synthetic trace %q (valid: %s)", kind, strings.Join(SynthKinds(), ", "))
	}
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = g.request(int64(i)*250, next())
	}
	return reqs, nil
}

// synth builds prompts as sequences of block contents and names each block
// by its content and its parent, which makes the ids prefix-chained.
type synth struct {
	r       *rand.Rand
	ids     map[[2]uint64]uint64
	content uint64 // the last fresh content drawn
}

// fresh returns block contents never used before.
func (g *synth) fresh(n int, dst []uint64) []uint64 {
	for range n {
		g.content++
		dst = append(dst, g.content)
	}
	return dst
}

// request names the blocks of a prompt whose block contents are given;
// the last block is partial, of 1 to 511 tokens.
func (g *synth) request(ts int64, contents []uint64) Request {
	req := Request{Timestamp: ts, OutputLength: 1 + g.r.IntN(800), HashIDs: make([]uint64, len(contents))}
	parent := ^uint64(0)
	for i, c := range contents {
		k := [2]uint64{parent, c}
		id, ok := g.ids[k]
		if !ok {
			id = uint64(len(g.ids))
			g.ids[k] = id
		}
		req.HashIDs[i], parent = id, id
	}
	req.InputLength = (len(contents)-1)*BlockSize + 1 + g.r.IntN(BlockSize-1)
	return req
}

func (g *synth) between(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

func (g *synth) system() func() []uint64 {
	const prompts = 12
	sys := make([][]uint64, prompts)
	for i := range sys {
		sys[i] = g.fresh(g.between(2, 16), nil)
	}
	z := rand.NewZipf(g.r, 1.2, 1, prompts-1)
	return func() []uint64 {
		p := append([]uint64(nil), sys[z.Uint64()]...)
		return g.fresh(g.between(1, 6), p)
	}
}

func (g *synth) chat() func() []uint64 {
	type session struct {
		prompt []uint64
		turns  int
	}
	const open = 400 // sessions in progress
	var sessions []*session
	newSession := func() *session {
		return &session{prompt: g.fresh(g.between(1, 6), []uint64{0}), turns: 1 + int(g.r.ExpFloat64()*7)}
	}
	for range open {
		sessions = append(sessions, newSession())
	}
	return func() []uint64 {
		i := g.r.IntN(len(sessions))
		s := sessions[i]
		p := append([]uint64(nil), s.prompt...)
		if s.turns--; s.turns <= 0 {
			sessions[i] = newSession()
		} else {
			// Next turn: this prompt's full blocks, the rest of its last
			// block with the answer, and the next message.
			s.prompt = g.fresh(g.between(1, 5), s.prompt[:len(s.prompt)-1])
		}
		return p
	}
}

func (g *synth) rag() func() []uint64 {
	const docs = 3000
	corpus := make([][]uint64, docs)
	for i := range corpus {
		corpus[i] = g.fresh(g.between(4, 12), nil)
	}
	instruction := g.fresh(1, nil)
	z := rand.NewZipf(g.r, 1.05, 4, docs-1)
	return func() []uint64 {
		p := append([]uint64(nil), instruction...)
		p = append(p, corpus[z.Uint64()]...)
		p = append(p, corpus[z.Uint64()]...)
		return g.fresh(g.between(1, 3), p)
	}
}
