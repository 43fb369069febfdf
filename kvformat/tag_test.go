package kvformat

import "testing"

func TestTagRoundTrip(t *testing.T) {
	s := Spec{Layers: 32, KVHeads: 8, HeadDim: 128, DType: BFloat16, Layout: Layout2LTD, ChunkTokens: 256}
	if got := s.Tag(); got != "bfloat16/KV_2LTD/32x8x128" {
		t.Errorf("Tag() = %q", got)
	}
	back, err := ParseTag(s.Tag(), 256)
	if err != nil || back != s {
		t.Fatalf("ParseTag(%q) = %+v, %v", s.Tag(), back, err)
	}
	for _, bad := range []string{"", "bfloat16/KV_2LTD", "bfloat16/KV_2LTD/32x8", "nope/KV_2LTD/1x1x1",
		"float16/NOPE/1x1x1", "float16/KV_2LTD/0x8x128", "float16/KV_2LTD/ax8x128", "a/b/c/d"} {
		if _, err := ParseTag(bad, 256); err == nil {
			t.Errorf("ParseTag(%q) accepted", bad)
		}
	}
}

func FuzzParseTag(f *testing.F) {
	f.Add("float16/KV_T2D/2x4x64", 16)
	f.Fuzz(func(t *testing.T, tag string, tokens int) {
		s, err := ParseTag(tag, tokens)
		if err == nil && s.Validate() != nil {
			t.Fatalf("ParseTag returned an invalid spec %+v", s)
		}
	})
}
