package chunk

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"

	"kvtier/internal/citest"
)

// referenceSGLangKeys restates get_hash_str with crypto/sha256: previous
// page's digest bytes, then each token as 4 little-endian bytes.
func referenceSGLangKeys(tokens []uint32, pageSize int) []string {
	var keys []string
	var prior []byte
	for start := 0; start+pageSize <= len(tokens); start += pageSize {
		h := sha256.New()
		h.Write(prior)
		for _, tok := range tokens[start : start+pageSize] {
			h.Write([]byte{byte(tok), byte(tok >> 8), byte(tok >> 16), byte(tok >> 24)})
		}
		prior = h.Sum(nil)
		keys = append(keys, hex.EncodeToString(prior))
	}
	return keys
}

func TestSGLangPageKeysMatchReference(t *testing.T) {
	tokens := sequentialTokens(64*3 + 10)
	for _, pageSize := range []int{1, 16, 64, 100, 1000} {
		got := SGLangPageKeys(nil, tokens, pageSize)
		want := referenceSGLangKeys(tokens, pageSize)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("page size %d: keys differ from the reference", pageSize)
		}
	}
}

// sglangGolden are SHA-256 chains over pages [0..3], [4..7] and
// [100000, 2^32-1, 0, 1] with page size 4, pinned.
var sglangGolden = []string{
	"baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe",
	"01414b052706d93bd0f1f1646c0e8ca2fa8ef5efd7bcc99f7a1cee8eb11ad052",
	"34bfacbf13c0ffded643b29d901f98a7fb96fdb5c7907a7182f4e9f2735b29f2",
}

var sglangGoldenTokens = []uint32{0, 1, 2, 3, 4, 5, 6, 7, 100000, 4294967295, 0, 1, 9}

func TestSGLangGolden(t *testing.T) {
	got := SGLangPageKeys(nil, sglangGoldenTokens, 4)
	if strings.Join(got, ",") != strings.Join(sglangGolden, ",") {
		t.Fatalf("keys = %q, want %q", got, sglangGolden)
	}
	first := SGLangPageHash(nil, sglangGoldenTokens[:4])
	second := SGLangPageHash(first[:], sglangGoldenTokens[4:8])
	if hex.EncodeToString(second[:]) != sglangGolden[1] {
		t.Fatal("SGLangPageHash does not chain like SGLangPageKeys")
	}
}

// TestSGLangAgainstPython runs the same chain through Python's hashlib, the
// way SGLang computes it, when Debian's python3 is installed.
func TestSGLangAgainstPython(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		citest.Missing(t, "no %s", python)
	}
	script := `
import hashlib
tokens = [0, 1, 2, 3, 4, 5, 6, 7, 100000, 4294967295, 0, 1, 9]
prior = None
for start in range(0, len(tokens) - 3, 4):
    h = hashlib.sha256()
    if prior:
        h.update(bytes.fromhex(prior))
    for t in tokens[start:start + 4]:
        h.update(t.to_bytes(4, byteorder="little", signed=False))
    prior = h.hexdigest()
    print(prior)
`
	out, err := exec.Command(python, "-c", script).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	got := strings.Fields(string(out))
	want := SGLangPageKeys(nil, sglangGoldenTokens, 4)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("python says %q, Go says %q", got, want)
	}
}

func TestSGLangEventHash(t *testing.T) {
	var h [32]byte
	h[0], h[7] = 0x80, 0x01
	if got, want := SGLangEventHash(h), int64(-0x7fffffffffffffff); got != want {
		t.Errorf("SGLangEventHash = %d, want %d", got, want)
	}
	h[0] = 0x00
	if got := SGLangEventHash(h); got != 1 {
		t.Errorf("SGLangEventHash = %d, want 1", got)
	}
}

func TestSGLangPageKeysPanicsOnBadPageSize(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("page size 0 did not panic")
		}
	}()
	SGLangPageKeys(nil, []uint32{1}, 0)
}

func TestSGLangPageHashDoesNotAllocate(t *testing.T) {
	tokens := sequentialTokens(64)
	var h [32]byte
	if allocs := testing.AllocsPerRun(50, func() { h = SGLangPageHash(h[:], tokens) }); allocs != 0 {
		t.Fatalf("SGLangPageHash allocated %v times per run", allocs)
	}
}
