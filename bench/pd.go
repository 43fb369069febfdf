package bench

import (
	"context"
	"fmt"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// benchPD times a prefill/decode transfer: the served daemon (the
// producer) pushes the chunks to a second daemon (the consumer, an engine
// served in this process on its own loopback port), from the producer's
// PUSH until the consumer's WAIT for all of them returns, next to a plain
// loopback TCP stream of the same bytes in the same round. The consumer's
// receive budget holds the whole push, so this is the transfer's speed,
// not the consumer's reading speed.
func benchPD(ctx context.Context, f Options, r *Report, d *DaemonReport, producer *engine.Engine, sock string, src, dst [][]byte) error {
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return err
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken, PDReceiveBytes: total})
	ln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	go svc.Serve(ln)
	defer svc.Shutdown(context.Background())
	addr := ln.Addr().String()
	pc, err := client.DialUnix(ctx, sock, client.Options{Name: "bench-producer"})
	if err != nil {
		return err
	}
	defer pc.Close()
	cc, err := client.DialTCP(ctx, addr, client.Options{Token: benchToken, Name: "bench-consumer", Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer cc.Close()
	keys := make([]chunk.Key, f.Chunks)
	for round := range f.Rounds + 1 {
		stream, err := plainTCPStream(src, dst)
		if err != nil {
			return err
		}
		for i := range keys {
			keys[i] = benchKey(uint32(4000+round), i)
		}
		if n, err := producer.Manager().Store(ctx, keys, src); err != nil || n != len(keys) {
			return fmt.Errorf("storing on the producer: %d of %d, %v", n, len(keys), err)
		}
		id := uint64(round + 1)
		var opErr error
		push := bestOf(1, total, func() error {
			opErr = pushAndWait(ctx, pc, cc, id, addr, keys)
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		clearChunks(dst)
		if n, _, err := cc.Retrieve(ctx, client.Raw(keys), dst); err != nil || n != len(dst) {
			return fmt.Errorf("reading the pushed chunks: %d of %d, %v", n, len(dst), err)
		}
		if err := sameChunks("PD bench", src, dst); err != nil {
			return err
		}
		if err := pushSettled(ctx, pc, id, len(keys)); err != nil {
			return err
		}
		if round > 0 {
			d.PDStreamGBps = max(d.PDStreamGBps, stream)
			d.PDPushGBps = max(d.PDPushGBps, push)
		}
	}
	d.PDPushRatio = d.PDPushGBps / d.PDStreamGBps
	return nil
}

// pushSettled waits until the producer counts transfer id's n chunks as
// pushed. The consumer can hold them all before the producer has read
// the consumer's acknowledgement of the last, so the status may still say
// pending for a moment after the chunks have arrived.
func pushSettled(ctx context.Context, pc *client.Client, id uint64, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := pc.PushStatus(ctx, id)
		switch {
		case err != nil || st.State == wire.TransferFailed:
			return fmt.Errorf("transfer %d: %+v, %v", id, st, err)
		case st.State == wire.TransferDone && st.Pushed == uint32(n):
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("transfer %d not settled after 10 s: %+v", id, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// pushAndWait pushes keys from the producer to the consumer at addr and
// returns once the consumer has them all.
func pushAndWait(ctx context.Context, pc, cc *client.Client, id uint64, addr string, keys []chunk.Key) error {
	if _, err := pc.Push(ctx, id, addr, client.Raw(keys), 0, true); err != nil {
		return err
	}
	w, err := cc.Wait(ctx, client.Raw(keys), 0, 30000)
	if err != nil {
		return err
	}
	if int(w.Chunks) != len(keys) {
		st, _ := pc.PushStatus(ctx, id)
		return fmt.Errorf("%d of %d chunks arrived (transfer %+v)", w.Chunks, len(keys), st)
	}
	return nil
}
