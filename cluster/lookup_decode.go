package cluster

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
)

// DecodeLookup parses a lookup request body into req, reusing its slices.
// It accepts what Decode would (strict: unknown fields, trailing data and
// values of the wrong type are errors), but reads the key and token
// arrays itself, without reflection: a 32k-token prompt is some 200 KB of
// JSON, which encoding/json reads in about a millisecond. The scope, a few
// short strings, goes through encoding/json. Field names must be written
// exactly (no escapes, no other case), and a field may appear once.
func DecodeLookup(data []byte, req *LookupRequest) error {
	req.Keys, req.Tokens, req.Scope = req.Keys[:0], req.Tokens[:0], nil
	p := lookupParser{b: data}
	if err := p.object(req); err != nil {
		return fmt.Errorf("decoding the body: %w", err)
	}
	return nil
}

// lookupParser reads one JSON object of a lookup request.
type lookupParser struct {
	b []byte
	i int
}

func (p *lookupParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *lookupParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek returns the next byte after whitespace, 0 at the end.
func (p *lookupParser) peek() byte {
	p.ws()
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *lookupParser) expect(c byte) error {
	if p.peek() != c {
		return p.errorf("want %q", c)
	}
	p.i++
	return nil
}

// object reads the request's fields, then checks nothing follows.
func (p *lookupParser) object(req *LookupRequest) error {
	if err := p.expect('{'); err != nil {
		return err
	}
	var seen [3]bool
	for first := true; ; first = false {
		if p.peek() == '}' && first {
			p.i++
			break
		}
		name, err := p.fieldName()
		if err != nil {
			return err
		}
		if err := p.expect(':'); err != nil {
			return err
		}
		var f int
		switch string(name) {
		case "keys":
			f = 0
		case "scope":
			f = 1
		case "tokens":
			f = 2
		default:
			return p.errorf("unknown field %q (want keys, or scope and tokens)", name)
		}
		if seen[f] {
			return p.errorf("field %q given twice", name)
		}
		seen[f] = true
		switch f {
		case 0:
			err = p.keys(req)
		case 1:
			err = p.scope(req)
		default:
			err = p.tokens(req)
		}
		if err != nil {
			return err
		}
		if p.peek() == '}' {
			p.i++
			break
		}
		if err := p.expect(','); err != nil {
			return err
		}
	}
	if p.ws(); p.i < len(p.b) {
		return errors.New("data after the JSON value")
	}
	return nil
}

// fieldName reads a quoted field name without escapes.
func (p *lookupParser) fieldName() ([]byte, error) {
	if err := p.expect('"'); err != nil {
		return nil, err
	}
	end := bytes.IndexByte(p.b[p.i:], '"')
	if end < 0 {
		return nil, p.errorf("unterminated field name")
	}
	name := p.b[p.i : p.i+end]
	if bytes.IndexByte(name, '\\') >= 0 {
		return nil, p.errorf("field name %q: escapes are not accepted", name)
	}
	p.i += end + 1
	return name, nil
}

// null consumes a literal null, reporting whether there was one.
func (p *lookupParser) null() bool {
	if p.peek() == 'n' && bytes.HasPrefix(p.b[p.i:], []byte("null")) {
		p.i += 4
		return true
	}
	return false
}

// array calls elem for each element of an array (or nothing for null).
func (p *lookupParser) array(what string, elem func() error) error {
	if p.null() {
		return nil
	}
	if p.peek() != '[' {
		return p.errorf("%s: want an array", what)
	}
	p.i++
	if p.peek() == ']' {
		p.i++
		return nil
	}
	for {
		p.ws()
		if err := elem(); err != nil {
			return err
		}
		switch p.peek() {
		case ',':
			p.i++
		case ']':
			p.i++
			return nil
		default:
			return p.errorf("%s: want ',' or ']'", what)
		}
	}
}

func (p *lookupParser) keys(req *LookupRequest) error {
	return p.array("keys", func() error {
		if len(req.Keys) >= MaxLookupKeys {
			return fmt.Errorf("%w: more than %d keys", ErrTooLarge, MaxLookupKeys)
		}
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return p.errorf("keys: want strings of 1 to 16 hex digits")
		}
		end := bytes.IndexByte(p.b[p.i+1:], '"')
		if end < 0 {
			return p.errorf("keys: unterminated string")
		}
		k, err := ParseHexKey(p.b[p.i : p.i+end+2])
		if err != nil {
			return p.errorf("keys: %v", err)
		}
		p.i += end + 2
		req.Keys = append(req.Keys, HexKey(k))
		return nil
	})
}

// tokens reads the token array in one tight loop: it is most of a
// lookup's body, and the time to decode it most of a lookup's time.
func (p *lookupParser) tokens(req *LookupRequest) error {
	if p.null() {
		return nil
	}
	if p.peek() != '[' {
		return p.errorf("tokens: want an array")
	}
	p.i++
	if p.peek() == ']' {
		p.i++
		return nil
	}
	// The loop keeps i and toks in locals (a deferred write-back would
	// keep them in memory and cost a third of the time).
	b, i, toks := p.b, p.i, req.Tokens
	for {
		// The common case, eight bytes at a time: a short integer and
		// its comma.
		for i+8 <= len(b) && len(toks) < MaxLookupTokens {
			v, n := digitsComma(binary.LittleEndian.Uint64(b[i:]))
			if n == 0 {
				break
			}
			toks = append(toks, v)
			i += n + 1
		}
		req.Tokens = toks
		// Anything else, byte by byte: whitespace, the last token, long
		// numbers, errors.
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if len(toks) >= MaxLookupTokens {
			return fmt.Errorf("%w: more than %d tokens", ErrTooLarge, MaxLookupTokens)
		}
		v, n, err := p.number(i)
		if err != nil {
			return err
		}
		toks = append(toks, uint32(v))
		req.Tokens = toks
		for i += n; i < len(b) && isSpace(b[i]); i++ {
		}
		p.i = i
		switch {
		case i < len(b) && b[i] == ',':
			i++
		case i < len(b) && b[i] == ']':
			p.i++
			return nil
		default:
			return p.errorf("tokens: want ',' or ']'")
		}
	}
}

// digitsComma reads eight bytes of a token array (little-endian in w)
// that start with 1 to 7 digits, the first not a zero unless alone, and
// a comma after them, as most token ids in a prompt are written: it
// returns their value and count, or a count of 0 for anything else,
// which the caller reads byte by byte. Finding the digits by bit
// arithmetic keeps the loop free of a branch per byte.
func digitsComma(w uint64) (uint32, int) {
	t := w ^ 0x3030303030303030 // digits become 0..9
	// A byte is not a digit when it is above 9 after the xor: its high
	// bit is set, or adding 0x76 to its low seven bits sets it.
	nd := (t | (t&0x7f7f7f7f7f7f7f7f + 0x7676767676767676)) & 0x8080808080808080
	n := bits.TrailingZeros64(nd) / 8
	if n == 0 || n == 8 || byte(t>>(8*uint(n))) != ','^'0' || n > 1 && byte(t) == 0 {
		return 0, 0
	}
	// Keep the n digits, moved to the top bytes with zeros below them,
	// and combine eight digits pairwise.
	t <<= 64 - 8*uint(n)
	t = (t & 0x0f0f0f0f0f0f0f0f) * 2561 >> 8
	t = (t & 0x00ff00ff00ff00ff) * 6553601 >> 16
	t = (t & 0x0000ffff0000ffff) * 42949672960001 >> 32
	return uint32(t), n
}

// number reads the integer at b[start:] byte by byte: an integer from 0
// to 2³²-1 written as JSON writes integers (no sign, no leading zero, no
// fraction or exponent). It returns its value and length.
func (p *lookupParser) number(start int) (uint64, int, error) {
	b, i := p.b, start
	var v uint64
	for i < len(b) && i-start <= 10 {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + uint64(c)
		i++
	}
	p.i = start
	n := i - start
	switch {
	case n == 0:
		return 0, 0, p.errorf("tokens: want token ids, integers from 0 to 4294967295")
	case n > 1 && b[start] == '0':
		return 0, 0, p.errorf("tokens: a number with a leading zero")
	case n > 10 || v > 1<<32-1:
		return 0, 0, p.errorf("tokens: %.12s… is more than 4294967295", b[start:])
	}
	if i < len(b) && (b[i] == '.' || b[i]|0x20 == 'e') {
		return 0, 0, p.errorf("tokens: want integers, got a fraction or exponent")
	}
	return v, n, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (p *lookupParser) scope(req *LookupRequest) error {
	if p.null() {
		return nil
	}
	if p.peek() != '{' {
		return p.errorf("scope: want an object")
	}
	start := p.i
	if err := p.skipObject(); err != nil {
		return err
	}
	var s Scope
	dec := json.NewDecoder(bytes.NewReader(p.b[start:p.i]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("scope: %w", err)
	}
	req.Scope = &s
	return nil
}

// skipObject moves past an object, tracking only strings and nesting:
// encoding/json checks the rest of the scope's grammar.
func (p *lookupParser) skipObject() error {
	depth := 0
	for p.i < len(p.b) {
		c := p.b[p.i]
		p.i++
		switch c {
		case '"':
			if err := p.skipString(); err != nil {
				return err
			}
		case '{', '[':
			if depth++; depth > 8 {
				return p.errorf("scope: nested too deep")
			}
		case '}', ']':
			if depth--; depth == 0 {
				return nil
			}
		}
	}
	return p.errorf("scope: unterminated object")
}

// skipString moves past the rest of a string whose opening quote is read.
func (p *lookupParser) skipString() error {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case '\\':
			p.i += 2
			continue
		case '"':
			p.i++
			return nil
		}
		p.i++
	}
	return p.errorf("unterminated string")
}

// Check reports a request that mixes the two forms, gives tokens without
// a scope, or a scope with a negative world size or rank.
func (r *LookupRequest) Check() error {
	switch {
	case len(r.Keys) > 0 && (r.Scope != nil || len(r.Tokens) > 0):
		return errors.New("give keys, or scope and tokens, not both")
	case r.Scope == nil && len(r.Tokens) > 0:
		return errors.New("tokens: a scope is required with them")
	case r.Scope != nil && (r.Scope.WorldSize < 0 || r.Scope.Rank < 0):
		return fmt.Errorf("scope: world_size %d and rank %d must not be negative", r.Scope.WorldSize, r.Scope.Rank)
	}
	return nil
}
