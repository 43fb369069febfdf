package tokenize

// byteRunes is GPT-2's reversible byte-to-unicode alphabet used by byte-level
// BPE vocabularies: printable Latin-1 bytes stand for themselves and the other
// 68 bytes are shifted to U+0100 and beyond, so that every vocabulary entry is
// a printable string without spaces or control characters.
var byteRunes = buildByteRunes()

// runeBytes inverts byteRunes.
var runeBytes = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteRunes {
		m[r] = byte(b)
	}
	return m
}()

func buildByteRunes() [256]rune {
	var out [256]rune
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	shift := 0
	for b := 0; b < 256; b++ {
		if printable(b) {
			out[b] = rune(b)
			continue
		}
		out[b] = rune(256 + shift)
		shift++
	}
	return out
}

// byteLevelString writes raw bytes in the byte-level alphabet, the form in
// which tokenizer.json stores vocabulary entries and merges.
func byteLevelString(raw []byte) string {
	rs := make([]rune, len(raw))
	for i, b := range raw {
		rs[i] = byteRunes[b]
	}
	return string(rs)
}

// rawBytes decodes a byte-level vocabulary entry back to the bytes it stands
// for; ok is false when the entry uses a character outside the alphabet (such
// an entry can only be produced as an added token, never by BPE).
func rawBytes(s string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(s))
	for _, r := range s {
		b, found := runeBytes[r]
		if !found {
			return nil, false
		}
		raw = append(raw, b)
	}
	return raw, true
}
