package kvformat

import (
	"fmt"
	"strings"
)

// DType is the element type of a KV cache. Its numeric values are stable:
// they are written into headers (header.go), so never renumber them.
// The zero value is invalid, so a forgotten field fails validation.
type DType uint8

// Supported element types, named as PyTorch names them.
const (
	Float16    DType = 1
	BFloat16   DType = 2
	Float32    DType = 3
	Float64    DType = 4
	Float8E4M3 DType = 5 // torch.float8_e4m3fn
	Float8E5M2 DType = 6 // torch.float8_e5m2
	Uint8      DType = 7
	Int8       DType = 8
)

type dtypeInfo struct {
	name string // canonical spelling, torch's name without "torch."
	size int    // bytes per element
	// lmcache is the code LMCache's lm:// protocol uses for this type
	// (DTYPE_TO_INT in lmcache/v1/protocol.py), 0 when it has none.
	lmcache int32
}

var dtypes = [...]dtypeInfo{
	Float16:    {"float16", 2, 2},
	BFloat16:   {"bfloat16", 2, 3},
	Float32:    {"float32", 4, 4},
	Float64:    {"float64", 8, 5},
	Float8E4M3: {"float8_e4m3fn", 1, 7},
	Float8E5M2: {"float8_e5m2", 1, 8},
	Uint8:      {"uint8", 1, 6},
	Int8:       {"int8", 1, 0},
}

// dtypeAliases are the other spellings users and engines write: vLLM's
// --kv-cache-dtype values, short forms and torch's own aliases. vLLM's "fp8"
// means e4m3 on CUDA; ROCm's e4m3fnuz is a different type and not supported.
var dtypeAliases = map[string]DType{
	"half": Float16, "fp16": Float16, "f16": Float16,
	"bf16":  BFloat16,
	"float": Float32, "fp32": Float32, "f32": Float32,
	"double": Float64, "fp64": Float64, "f64": Float64,
	"fp8": Float8E4M3, "fp8_e4m3": Float8E4M3, "float8_e4m3": Float8E4M3,
	"fp8_e5m2": Float8E5M2,
}

// Valid reports whether d is one of the supported types.
func (d DType) Valid() bool { return d != 0 && int(d) < len(dtypes) }

// Size returns the size of one element in bytes, or 0 for an invalid type.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypes[d].size
}

// String returns the canonical name ("bfloat16", "float8_e4m3fn", ...).
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypes[d].name
}

// ParseDType accepts the canonical names, a "torch." prefix and the common
// aliases (fp16, half, bf16, fp32, fp8, fp8_e4m3, fp8_e5m2, ...), ignoring
// case.
func ParseDType(s string) (DType, error) {
	name := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "torch.")
	for d := range dtypes {
		if dtypes[d].name != "" && dtypes[d].name == name {
			return DType(d), nil
		}
	}
	if d, ok := dtypeAliases[name]; ok {
		return d, nil
	}
	return 0, fmt.Errorf("kvformat: unknown dtype %q", s)
}

// MarshalText implements encoding.TextMarshaler, for configuration files.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("kvformat: cannot marshal invalid %v", d)
	}
	return []byte(d.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseDType.
func (d *DType) UnmarshalText(text []byte) error {
	v, err := ParseDType(string(text))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// LMCacheCode returns the dtype code LMCache's lm:// protocol uses for d, or
// 0 (LMCache's "none") when LMCache has no code for it.
func (d DType) LMCacheCode() int32 {
	if !d.Valid() {
		return 0
	}
	return dtypes[d].lmcache
}

// DTypeFromLMCache maps an lm:// protocol dtype code to a DType. LMCache
// sends 1 (torch.half) and 2 (torch.float16) for the same type.
func DTypeFromLMCache(code int32) (DType, error) {
	if code == 1 {
		return Float16, nil
	}
	for d := range dtypes {
		if code != 0 && dtypes[d].lmcache == code {
			return DType(d), nil
		}
	}
	return 0, fmt.Errorf("kvformat: unknown LMCache dtype code %d", code)
}
