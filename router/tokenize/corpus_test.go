package tokenize

import (
	"math/rand/v2"
	"strings"
)

// corpus is varied text for equivalence tests: prose, code, numbers,
// whitespace runs (the lookahead case), line endings, emoji, CJK, scripts
// with marks, contractions in odd cases and special tokens.
var corpus = []string{
	"",
	"Hello, world!",
	"The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see—maybe.",
	"I'M SURE THEY'RE HERE, AREN'T THEY? You've, we'd, she'll, I'm, 'tis, rock'n'roll",
	"func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i * 2\n\t}\n}\n",
	"def f(x):\n    return x ** 2  # square\n\n\nclass A:\n    pass\n",
	"1234567890 3.14159 -42 1,000,000 0x1F 2026-11-22T09:00:00Z 12345678901234567890",
	"a  b   c    d\t\te \t f\n\ng\r\nh\r\n\r\ni   \n   j",
	"trailing spaces   ",
	"   leading spaces",
	"\n\n\n",
	"   ",
	" ",
	"x \n y",
	"word  \nnext",
	"emoji 😀😃🎉 👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣",
	"日本語のテキストです。中文文本，还有标点！한국어 텍스트",
	"Ünïcödé naïve café résumé façade Ελληνικά русский текст עברית العربية हिन्दी",
	"combining e\u0301 a\u0308 nbsp\u00a0here ideographic\u3000space zero\u200bwidth",
	"<|endoftext|>Hello<|endoftext|> <|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>",
	"not special: <|endoftext| <|unknown|> <|",
	"URL https://example.com/path?q=1&r=2#frag and e-mail a.b@c.io",
	"JSON {\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
	"Markdown # Title\n\n- item one\n- item two\n\n```go\nx := 1\n```\n",
	"!!!???... ---- ==== //// \\\\\\\\ ~~~~",
	"mixed123abc456 ABCdefGHI a1b2c3",
	"cepaces", // found by FuzzEncode: a merged-away symbol must not merge again
	"\t\t\tindented\n\t\t\t\n",
	strings.Repeat(" ", 100) + "x" + strings.Repeat("\n", 50) + strings.Repeat("ab", 200),
	strings.Repeat("lorem ipsum dolor sit amet, ", 40),
}

// alphabet feeds randomText: every character class and the tricky
// combinations of the split patterns (apostrophes before letters, spaces
// before punctuation and digits, line breaks inside whitespace runs).
var alphabet = []string{
	"a", "Z", "é", "ß", "中", "ア", "한", "1", "٣", "Ⅻ", "½", " ", "  ", "\t", "\n", "\r", "\r\n",
	"\u00a0", "\u3000", "\u2028", "\v", "\f", "'", "s", "S", "t", "re", "VE", "ll", "d", "m",
	".", ",", "!", "/", "-", "_", "(", ")", "\"", "😀", "\u0301", "\u200d", "<|endoftext|>", "x",
}

func randomText(rng *rand.Rand, parts int) string {
	var b strings.Builder
	for range parts {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}
