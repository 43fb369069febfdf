package codec

import (
	"bytes"
	"errors"
	"testing"

	"kvtier/kvformat"
)

func TestOpaqueObjects(t *testing.T) {
	chunk := bytes.Repeat([]byte("not a KV layout, odd length"), 1001)
	for _, name := range []string{"raw", "zstd", "lz4"} {
		c, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := Seal(nil, c, kvformat.Spec{}, chunk)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, info, err := Unseal(nil, obj)
		if err != nil || !bytes.Equal(got, chunk) || !info.Opaque() || info.Tokens() != 0 {
			t.Fatalf("%s: opaque round trip: %v opaque=%v", name, err, info.Opaque())
		}
	}
	for _, name := range []string{"int8", "fp8"} {
		c, _ := Lookup(name)
		if _, err := Seal(nil, c, kvformat.Spec{}, make([]byte, 512)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s sealed an opaque object: %v", name, err)
		}
	}
}
