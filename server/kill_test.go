package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/internal/servetest"
	"kvtier/server"
)

// The kill tests run a real client process (this test binary re-executed)
// that takes arena memory and is then killed with SIGKILL, so nothing of
// its own cleanup runs: the daemon must notice the closed connection.

const childEnv = "KVTIER_TEST_CHILD"

// TestMain lets the binary act as the child client when asked to.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode, os.Getenv("KVTIER_TEST_SOCK")))
	}
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// runChild stores or retrieves half-way, prints "ready", and waits to be
// killed.
func runChild(mode, sock string) int {
	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "child"})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	h, err := c.Scope(ctx, pScope)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	tokens := prompt(4*pChunkTokens, 11)
	switch mode {
	case "store":
		slots, err := c.PrepareStore(ctx, client.Tokens(h, tokens, 0), sizesOf(4, pChunkBytes), 60_000)
		if err != nil || len(slots.Slots) != 4 {
			fmt.Println("error", err)
			return 1
		}
		// Write two and a half chunks, then stop: a store cut short.
		for j, s := range slots.Slots[:3] {
			dst, _ := c.Slot(s)
			data := chunkData(j, 11, pChunkBytes)
			if j == 2 {
				data = data[:len(data)/2]
			}
			copy(dst, data)
		}
	case "retrieve":
		slots, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 60_000)
		if err != nil || len(slots.Slots) != 4 {
			fmt.Println("error", err, len(slots.Slots))
			return 1
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	return 0
}

func startChild(t *testing.T, mode, sock string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "KVTIER_TEST_SOCK="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q %v", line, err)
	}
	return cmd
}

func TestKilledClientMidStore(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	before := d.eng.Arena().Used()
	child := startChild(t, "store", d.sock)
	if d.eng.Arena().Used() < before+4*pChunkBytes {
		t.Fatalf("the child's reservations are not in the arena: used %d", d.eng.Arena().Used())
	}
	child.Process.Kill()
	child.Wait()
	waitFor(t, "the killed client's reservations to return", func() bool {
		return d.eng.Arena().Used() == before && d.svc.Connections() == 0
	})
	c := d.local(t)
	h, _ := c.Scope(context.Background(), pScope)
	hit, err := c.Lookup(context.Background(), client.Tokens(h, prompt(4*pChunkTokens, 11), 0), 0)
	if err != nil || hit.Chunks != 0 {
		t.Fatalf("a killed client's half-written store is visible: %+v %v", hit, err)
	}
}

func TestKilledClientMidRetrieve(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	c := d.local(t)
	h, _ := c.Scope(context.Background(), pScope)
	tokens := prompt(4*pChunkTokens, 11)
	storeLocal(t, c, h, tokens, 11)
	child := startChild(t, "retrieve", d.sock)
	if d.eng.Arena().Pinned() < 4*pChunkBytes {
		t.Fatalf("the child's retrieve lease pins %d bytes", d.eng.Arena().Pinned())
	}
	child.Process.Kill()
	child.Wait()
	waitFor(t, "the killed client's leases to end", func() bool { return d.eng.Arena().Pinned() == 0 })
	// The chunks themselves stay cached.
	hit, err := c.Lookup(context.Background(), client.Tokens(h, tokens, 0), 0)
	if err != nil || hit.Chunks != 4 {
		t.Fatalf("after the reader died: %+v %v", hit, err)
	}
}
