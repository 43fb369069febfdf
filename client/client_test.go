package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

func daemon(t *testing.T) string {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 4 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{})
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := server.ListenUnix(sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	go svc.Serve(ln)
	t.Cleanup(func() { svc.Shutdown(context.Background()); eng.Close() })
	return sock
}

func TestDialErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.DialUnix(ctx, filepath.Join(t.TempDir(), "none"), client.Options{}); err == nil {
		t.Error("dialing a missing socket succeeded")
	}
	if _, err := client.DialTCP(ctx, "127.0.0.1:1", client.Options{}); err == nil {
		t.Error("dialing a closed port succeeded")
	}
}

func TestSlotBoundsAndClose(t *testing.T) {
	ctx := context.Background()
	c, err := client.DialUnix(ctx, daemon(t), client.Options{Populate: true})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Local() || c.ChunkTokens() != 16 {
		t.Fatalf("local %v, chunk tokens %d", c.Local(), c.ChunkTokens())
	}
	if _, err := c.Slot(wire.Slot{Offset: 4 << 20, Len: 1}); err == nil {
		t.Error("a slot past the arena was handed out")
	}
	if _, err := c.Slot(wire.Slot{Offset: ^uint64(0), Len: 2}); err == nil {
		t.Error("an overflowing slot was handed out")
	}
	b, err := c.Slot(wire.Slot{Offset: 4096, Len: 10})
	if err != nil || len(b) != 10 || cap(b) != 10 {
		t.Errorf("slot: len %d cap %d %v", len(b), cap(b), err)
	}
	if _, err := c.Lookup(ctx, client.Tokens(9, []uint32{1}, 0), 0); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("unknown scope handle: %v", err)
	}
	h, err := c.Scope(ctx, chunk.Scope{Model: "m", WorldSize: 1})
	if err != nil || h == 0 {
		t.Fatal(h, err)
	}
	c.Close()
	if err := c.Ping(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Ping after Close: %v", err)
	}
}

// TestDaemonGoneIsAnErrorNotAHang: a client whose daemon went away gets an
// error at once, and every later call too.
func TestDaemonGoneIsAnErrorNotAHang(t *testing.T) {
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 1 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{})
	sock := filepath.Join(t.TempDir(), "s")
	ln, _ := server.ListenUnix(sock, 0)
	go svc.Serve(ln)
	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	svc.Shutdown(ctx)
	if err := c.Ping(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Ping to a stopped daemon: %v", err)
	}
	if err := c.Ping(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("second Ping: %v", err)
	}
}
