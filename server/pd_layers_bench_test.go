package server_test

import (
	"context"
	"fmt"
	"testing"

	"kvtier/client"
	"kvtier/server"
)

// BenchmarkReceiveLayers sends n chunks of 64 KiB layer by layer (4
// layers × 2 parts: 8n ranges) to a daemon in the process, reads them (ending their holds) and clears them. With -benchmem, allocs/op should not grow with n: nothing is
// allocated per range or per chunk once the connection is warm.
func BenchmarkReceiveLayers(b *testing.B) {
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			cons := startService(b, 64<<20, server.ServiceOptions{})
			c, cc := cons.remote(b), cons.local(b)
			m, chunks := layered(b, n, 90, 64<<10)
			ctx := context.Background()
			dst := make([][]byte, n)
			for j := range dst {
				dst[j] = make([]byte, 64<<10)
			}
			b.SetBytes(int64(n * (64 << 10)))
			b.ReportAllocs()
			for b.Loop() {
				if got, err := c.ReceiveLayers(ctx, m, chunks, nil, nil); err != nil || got != n {
					b.Fatalf("%d, %v", got, err)
				}
				// Reading ends the holds; clearing makes the next round store anew.
				if got, _, err := cc.Retrieve(ctx, client.Raw(m.Keys.Raw), dst); err != nil || got != n {
					b.Fatalf("retrieve: %d, %v", got, err)
				}
				if _, err := cc.Clear(ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
