package arena_test

import (
	"fmt"
	"time"

	"kvtier/arena"
)

func Example() {
	a, err := arena.New(arena.Options{Capacity: 64 << 20})
	if err != nil {
		panic(err)
	}
	defer a.Close()

	id, err := a.Alloc(1 << 20) // one chunk's KV
	if err != nil {
		panic(err)
	}
	copy(a.Bytes(id), "kv bytes")

	// A reader in the engine process gets a lease and the offset; it reads
	// the bytes through its own mapping of a.Fd().
	lease, err := a.Lease(id, 5*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("offset", a.Offset(id), "pinned", a.Pinned())

	a.Release(lease)
	a.Unref(id) // the owner evicts: the pages are free again
	fmt.Println("used", a.Used())
	// Output:
	// offset 0 pinned 1048576
	// used 0
}
