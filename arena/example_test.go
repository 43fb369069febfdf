package arena_test

import (
	"fmt"

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

	// A reader in the serving engine is given the offset and reads the
	// bytes through its own mapping of a.Fd(); the daemon holds a reference
	// for it (under a lease of its own) until it is done, so eviction
	// passes the object by.
	a.Ref(id)
	fmt.Println("offset", a.Offset(id), "pinned", a.Pinned())

	a.Unref(id) // the reader is done
	a.Unref(id) // the owner evicts: the pages are free again
	fmt.Println("used", a.Used())
	// Output:
	// offset 0 pinned 1048576
	// used 0
}
