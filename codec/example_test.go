package codec_test

import (
	"fmt"

	"kvtier/codec"
	"kvtier/kvformat"
)

func Example() {
	spec := kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvformat.BFloat16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	chunk := codec.SyntheticKV(spec, 16, 1) // made-up KV, see its doc

	c, err := codec.Lookup("int8")
	if err != nil {
		panic(err)
	}
	obj, err := codec.Seal(nil, c, spec, chunk)
	if err != nil {
		panic(err)
	}

	// A reader learns what it holds from the header alone...
	info, err := codec.PeekInfo(obj[:codec.HeaderSize])
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Codec.Name(), info.Spec.Tag(), info.Tokens(), "tokens")
	fmt.Println(info.RawLen, "bytes in", info.ObjectLen())

	// ...and decodes into a buffer sized from it, without further allocation.
	back, _, err := codec.Unseal(make([]byte, 0, info.RawLen), obj)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(back) == len(chunk))
	// Output:
	// int8 bfloat16/KV_2LTD/2x2x64 16 tokens
	// 16384 bytes in 8768
	// true
}
