package announce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"

	"kvtier/internal/ratelog"
	"kvtier/kvevents"
)

// Socket is what every KV-event stream a daemon publishes shares: a ZMQ
// PUB socket, one topic, and a bounded queue drained in order by one
// goroutine that turns each item into a batch and sends it as the three
// frames vLLM's subscribers read (topic, 8-byte big-endian sequence
// number, payload). The router's stream (Publisher) and the cluster's
// chunk stream (cluster/member) differ only in what an item is and how
// they number items.
//
// A full queue drops the item, and the caller's sequence number for it
// stays unused, so the subscriber sees a gap instead of stale state: a
// slow subscriber never slows the tiers.
type Socket[T any] struct {
	label string // names the stream in errors and log lines
	topic []byte
	sock  zmq4.Socket
	log   *slog.Logger
	logs  ratelog.Set // send failures: one per batch while the socket fails
	enc   kvevents.Encoder
	fill  func(T, *kvevents.Batch)

	mu     sync.Mutex
	closed bool
	queue  chan numbered[T]

	sent, dropped atomic.Uint64
	done          chan struct{}
	cancel        context.CancelFunc
}

type numbered[T any] struct {
	seq  uint64
	item T
}

// SocketOptions configure a Socket.
type SocketOptions struct {
	Endpoint   string // the ZMQ address to bind, e.g. "tcp://*:5560"
	Topic      string
	Label      string // prefixes errors and log lines, e.g. "kv events"
	Encoding   kvevents.Encoding
	QueueDepth int
	Logger     *slog.Logger
}

// Bind binds the socket and starts its sender. fill turns one queued item
// into the batch to send (b is reset and stamped before each call).
func Bind[T any](o SocketOptions, fill func(item T, b *kvevents.Batch)) (*Socket[T], error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewPub(ctx)
	if err := sock.Listen(o.Endpoint); err != nil {
		cancel()
		sock.Close()
		return nil, fmt.Errorf("%s: binding %s: %w", o.Label, o.Endpoint, err)
	}
	s := &Socket[T]{label: o.Label, topic: []byte(o.Topic), sock: sock, log: o.Logger,
		enc: kvevents.Encoder{Encoding: o.Encoding}, fill: fill,
		queue: make(chan numbered[T], o.QueueDepth), done: make(chan struct{}), cancel: cancel}
	go s.send()
	return s, nil
}

// Addr returns the bound address (useful with port 0).
func (s *Socket[T]) Addr() string { return s.sock.Addr().String() }

// Queue hands item to the sender under sequence number seq, or drops it
// when the queue is full or the socket is closed. Callers number items
// and call Queue under one lock of their own, so the queue stays in
// sequence order: out-of-order numbers would look like a publisher restart.
func (s *Socket[T]) Queue(seq uint64, item T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	select {
	case s.queue <- numbered[T]{seq, item}:
	default:
		s.dropped.Add(1)
	}
}

// send publishes queued items in order, one message each.
func (s *Socket[T]) send() {
	defer close(s.done)
	var seqFrame [8]byte
	var batch kvevents.Batch
	var payload []byte
	for n := range s.queue {
		batch.Reset()
		batch.Timestamp = kvevents.Now()
		s.fill(n.item, &batch)
		payload = s.enc.Append(payload[:0], &batch)
		binary.BigEndian.PutUint64(seqFrame[:], n.seq)
		// zmq4 may keep the frames until written: give it its own copies.
		msg := zmq4.NewMsgFrom(s.topic, append([]byte(nil), seqFrame[:]...), append([]byte(nil), payload...))
		if err := s.sock.SendMulti(msg); err != nil {
			s.logs.Log(s.log, slog.LevelWarn, s.label+": sending", "err", err)
			continue
		}
		s.sent.Add(1)
	}
}

// Stats reports messages sent and dropped.
func (s *Socket[T]) Stats() (sent, dropped uint64) { return s.sent.Load(), s.dropped.Load() }

// Close sends what is queued and closes the socket; later Queue calls
// drop nothing and send nothing.
func (s *Socket[T]) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	<-s.done
	// zmq4's Close cancels the socket's context and then closes each
	// peer connection, which the connection's own goroutine may have
	// closed already on that cancellation: "use of closed network
	// connection" for a socket that did close. It made a daemon's clean
	// stop exit 1 now and then; it means closed, so it is not an error.
	err := s.sock.Close()
	s.cancel()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Medium maps a local tier to the medium KV events name it by: RAM is
// "CPU" and disk "DISK", as vLLM's offloading tiers and the router's
// index call them. Other tiers are not announced ("").
func Medium(tierName string) string {
	switch tierName {
	case "mem":
		return "CPU"
	case "disk":
		return "DISK"
	}
	return ""
}
