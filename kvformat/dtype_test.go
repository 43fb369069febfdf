package kvformat

import "testing"

func TestDTypeNamesAndSizes(t *testing.T) {
	want := []struct {
		d    DType
		name string
		size int
	}{
		{Float16, "float16", 2},
		{BFloat16, "bfloat16", 2},
		{Float32, "float32", 4},
		{Float64, "float64", 8},
		{Float8E4M3, "float8_e4m3fn", 1},
		{Float8E5M2, "float8_e5m2", 1},
		{Uint8, "uint8", 1},
		{Int8, "int8", 1},
	}
	for _, w := range want {
		if got := w.d.String(); got != w.name {
			t.Errorf("%d.String() = %q, want %q", w.d, got, w.name)
		}
		if got := w.d.Size(); got != w.size {
			t.Errorf("%v.Size() = %d, want %d", w.d, got, w.size)
		}
		for _, s := range []string{w.name, "torch." + w.name, " " + w.name + " "} {
			if got, err := ParseDType(s); err != nil || got != w.d {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", s, got, err, w.d)
			}
		}
		text, err := w.d.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back DType
		if err := back.UnmarshalText(text); err != nil || back != w.d {
			t.Errorf("text round trip of %v gave %v, %v", w.d, back, err)
		}
	}
}

func TestDTypeAliases(t *testing.T) {
	for alias, want := range map[string]DType{
		"fp16": Float16, "half": Float16, "bf16": BFloat16, "BF16": BFloat16,
		"fp32": Float32, "float": Float32, "fp8": Float8E4M3, "fp8_e4m3": Float8E4M3,
		"float8_e4m3": Float8E4M3, "fp8_e5m2": Float8E5M2, "torch.bfloat16": BFloat16,
	} {
		if got, err := ParseDType(alias); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %v, %v; want %v", alias, got, err, want)
		}
	}
}

func TestDTypeInvalid(t *testing.T) {
	for _, s := range []string{"", "auto", "float8_e4m3fnuz", "int4", "torch."} {
		if d, err := ParseDType(s); err == nil {
			t.Errorf("ParseDType(%q) = %v, want an error", s, d)
		}
	}
	for _, d := range []DType{0, 9, 255} {
		if d.Valid() || d.Size() != 0 || d.LMCacheCode() != 0 {
			t.Errorf("DType(%d) should be invalid with size 0 and no LMCache code", d)
		}
		if _, err := d.MarshalText(); err == nil {
			t.Errorf("DType(%d).MarshalText succeeded", d)
		}
	}
}

// LMCache's lm:// protocol codes, from DTYPE_TO_INT in its protocol module.
func TestDTypeLMCacheCodes(t *testing.T) {
	codes := map[DType]int32{
		Float16: 2, BFloat16: 3, Float32: 4, Float64: 5, Uint8: 6, Float8E4M3: 7, Float8E5M2: 8, Int8: 0,
	}
	for d, code := range codes {
		if got := d.LMCacheCode(); got != code {
			t.Errorf("%v.LMCacheCode() = %d, want %d", d, got, code)
		}
		if code == 0 {
			continue
		}
		if back, err := DTypeFromLMCache(code); err != nil || back != d {
			t.Errorf("DTypeFromLMCache(%d) = %v, %v; want %v", code, back, err, d)
		}
	}
	if d, err := DTypeFromLMCache(1); err != nil || d != Float16 {
		t.Errorf("DTypeFromLMCache(1) (torch.half) = %v, %v; want float16", d, err)
	}
	for _, code := range []int32{0, 9, -1} {
		if _, err := DTypeFromLMCache(code); err == nil {
			t.Errorf("DTypeFromLMCache(%d) succeeded", code)
		}
	}
}

func TestLayoutNames(t *testing.T) {
	want := map[Layout]string{Layout2LTD: "KV_2LTD", LayoutT2D: "KV_T2D", Layout2TD: "KV_2TD", LayoutMLA: "KV_MLA_FMT"}
	// The numeric values are LMCache's MemoryFormat enum values.
	values := map[Layout]uint8{Layout2LTD: 1, LayoutT2D: 2, Layout2TD: 3, LayoutMLA: 6}
	for l, name := range want {
		if l.String() != name {
			t.Errorf("%d.String() = %q, want %q", l, l.String(), name)
		}
		if uint8(l) != values[l] {
			t.Errorf("%v = %d, LMCache's MemoryFormat says %d", l, l, values[l])
		}
		for _, s := range []string{name, "MemoryFormat." + name, "kv_" + name[3:]} {
			if got, err := ParseLayout(s); err != nil || got != l {
				t.Errorf("ParseLayout(%q) = %v, %v; want %v", s, got, err, l)
			}
		}
		var back Layout
		text, _ := l.MarshalText()
		if err := back.UnmarshalText(text); err != nil || back != l {
			t.Errorf("text round trip of %v gave %v, %v", l, back, err)
		}
	}
	for _, s := range []string{"", "BINARY", "KV_2LT", "MemoryFormat.", "UNDEFINED"} {
		if l, err := ParseLayout(s); err == nil {
			t.Errorf("ParseLayout(%q) = %v, want an error", s, l)
		}
	}
	for _, l := range []Layout{0, 4, 5, 7, 200} {
		if l.Valid() {
			t.Errorf("Layout(%d) should be invalid", l)
		}
		if _, err := l.MarshalText(); err == nil {
			t.Errorf("Layout(%d).MarshalText succeeded", l)
		}
	}
	var l Layout
	if err := l.UnmarshalText([]byte("nope")); err == nil || l != 0 {
		t.Errorf("UnmarshalText(nope) = %v, left %v", err, l)
	}
}
