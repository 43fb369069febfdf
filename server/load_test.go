package server_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// TestLoad runs 16 clients, half on the local socket and half over TCP,
// storing, looking up and retrieving a shared pool of prompts in an arena
// too small for all of them, for a bounded time. Every chunk read back
// must hold exactly the bytes stored for it; no request may fail; the
// arena never exceeds its capacity; every pin is gone at the end; and the
// process's memory does not keep growing.
func TestLoad(t *testing.T) {
	duration := 2 * time.Second
	if testing.Short() {
		duration = 500 * time.Millisecond
	}
	const arenaBytes = 24 * pChunkBytes
	d := startService(t, arenaBytes, server.ServiceOptions{})
	stop := make(chan struct{})
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	var ops [16]int
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- loadClient(d, i, i%2 == 0, stop, &ops[i])
		}()
	}
	watchDone := make(chan struct{})
	var overCapacity bool
	var rssMid int64
	go func() {
		defer close(watchDone)
		start := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if d.eng.Arena().Used() > arenaBytes {
				overCapacity = true
			}
			if rssMid == 0 && time.Since(start) > duration/2 {
				rssMid = rss()
			}
		}
	}()
	time.Sleep(duration)
	close(stop)
	wg.Wait()
	<-watchDone
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	total := 0
	for _, n := range ops {
		total += n
	}
	t.Logf("%d requests by 16 clients", total)
	if overCapacity {
		t.Error("the arena went over capacity")
	}
	// Clients closed their connections; the daemon notices each close.
	waitFor(t, "every pin to end once the clients are gone", func() bool {
		return d.svc.Connections() == 0 && d.eng.Arena().Pinned() == 0
	})
	// Memory: the second half of the run may not grow RSS by more than a
	// generous margin (the arena is mapped up front; buffers are reused).
	if end := rss(); rssMid > 0 && end > rssMid+64<<20 {
		t.Errorf("RSS grew from %d MiB at mid-run to %d MiB at the end", rssMid>>20, end>>20)
	}
}

// loadClient runs one client's loop until stop.
func loadClient(d *daemon, i int, local bool, stop <-chan struct{}, ops *int) error {
	ctx := context.Background()
	var c *client.Client
	var err error
	if local {
		c, err = client.DialUnix(ctx, d.sock, client.Options{})
	} else {
		c, err = client.DialTCP(ctx, d.tcp, client.Options{Token: testToken})
	}
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.Scope(ctx, pScope)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(i), 1))
	bufs := make([][]byte, 4)
	for j := range bufs {
		bufs[j] = make([]byte, pChunkBytes)
	}
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		salt := uint32(rng.IntN(12)) // a shared pool of 12 prompts of 4 chunks
		tokens := prompt(4*pChunkTokens, salt)
		keys := client.Tokens(h, tokens, 0)
		var err error
		switch op := rng.IntN(3); {
		case op == 0 && local:
			err = loadStoreLocal(ctx, c, keys, salt)
		case op == 0:
			chunks := make([][]byte, 4)
			for j := range chunks {
				chunks[j] = chunkData(j, salt, pChunkBytes)
			}
			_, err = c.Store(ctx, keys, chunks)
		case op == 1:
			_, err = c.Lookup(ctx, keys, uint32(rng.IntN(2)*50))
		case local:
			err = loadRetrieveLocal(ctx, c, keys, salt)
		default:
			var n int
			n, _, err = c.Retrieve(ctx, keys, bufs)
			for j := 0; j < n && err == nil; j++ {
				if !bytes.Equal(bufs[j], chunkData(j, salt, pChunkBytes)) {
					err = fmt.Errorf("client %d: TCP retrieve of prompt %d chunk %d returned wrong bytes", i, salt, j)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("client %d (local=%v): %w", i, local, err)
		}
		*ops++
	}
}

func loadStoreLocal(ctx context.Context, c *client.Client, keys wire.Keys, salt uint32) error {
	slots, err := c.PrepareStore(ctx, keys, sizesOf(4, pChunkBytes), 0)
	if err != nil {
		return err
	}
	for j, s := range slots.Slots {
		if s.State == wire.SlotWrite {
			dst, err := c.Slot(s)
			if err != nil {
				return err
			}
			copy(dst, chunkData(j, salt, pChunkBytes))
		}
	}
	if slots.Lease == 0 {
		return nil
	}
	_, err = c.CommitStore(ctx, slots.Lease, len(slots.Slots))
	return err
}

func loadRetrieveLocal(ctx context.Context, c *client.Client, keys wire.Keys, salt uint32) error {
	slots, err := c.PrepareRetrieve(ctx, keys, 0)
	if err != nil {
		return err
	}
	for j, s := range slots.Slots {
		got, err := c.Slot(s)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, chunkData(j, salt, pChunkBytes)) {
			return fmt.Errorf("local retrieve of prompt %d chunk %d returned wrong bytes", salt, j)
		}
	}
	if slots.Lease == 0 {
		return nil
	}
	return c.Release(ctx, slots.Lease)
}

// rss returns this process's resident set size in bytes (0 if unknown).
func rss() int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}
