// Package s3 is a remote tier on Amazon S3 and S3-compatible object stores
// (MinIO, Ceph RGW, versitygw, ...), registered as the "s3" URL scheme of
// package kvtier/tier/remote.
//
// Each chunk is one object named prefix + 16 hex digits of the key's scope
// + 32 hex digits of its hash. Objects are opaque bytes: the codec layer
// above adds the header and checksum. Because a key names its content,
// every write of a key carries the same bytes, so a Put that finds the
// object already there skips the upload, and S3's whole-object PUT
// semantics are enough to keep concurrent writers from ever showing a
// reader a mix of two writes.
//
// # Round trips
//
// Get is one GET whose body is read straight into the caller's buffer;
// GetRange (layerwise loads of pieced objects) one GET with a Range header.
// Put is a HEAD (skipped when the key is known present) and one PUT with the
// length known up front: objects up to MaxSinglePut bytes go as a single
// request, never through multipart buffering, and the payload is sent
// unsigned so the client does not hash it on the CPU (TLS or the codec's
// checksum protects the bytes). PrefixContains sends one HEAD per key,
// Config.Parallelism at a time, and stops issuing them past the first
// missing key. Listing is no alternative: keys are hashes, so their
// lexical order says nothing about their order in a prompt, and a LIST of
// the scope would page through every chunk of the model.
//
// Keys seen present (by Put, Get, Size or PrefixContains) are remembered
// with their sizes in a small bounded cache, so a presence check, Size and
// Get of one chunk cost one HEAD and one GET. A remembered key that was
// deleted behind the tier's back is reported present (and not uploaded
// again by Put) until a Get finds it missing (ErrNotFound, a miss to the
// manager) and forgets it.
//
// # URL and credentials
//
//	s3://[access:secret@]bucket[/prefix]?endpoint=host:port&region=r&secure=false&path_style=true&create=true&layer_ranges=true
//
// endpoint defaults to AWS S3, secure to true, the prefix to "kvtier/".
// path_style=true puts the bucket in the request path, which most
// self-hosted servers need. create=true creates the bucket when it is
// missing. layer_ranges=true makes layerwise loads read a chunk a few
// layers per Range GET; by default they read each chunk whole, which was
// faster here (docs/layerwise.md).
//
// Credentials are taken from exactly one place, in this order:
//  1. the URL's user information, access:secret@ (percent-encode any '/',
//     '+' or '@' in the secret);
//  2. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the
//     optional AWS_SESSION_TOKEN.
//
// The URL wins as a whole; the two sources are never mixed. With neither,
// Open fails rather than sending anonymous requests.
//
// Every operation is bounded by a deadline: Config.Timeout for its round
// trip plus, for a GET or PUT, the object's bytes at Config.Bandwidth
// (remote.CallDeadline). Only checking the bucket when the tier opens gets
// longer, openTimeout, since it may include the first TLS handshake.
package s3

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"kvtier/chunk"
	"kvtier/internal/ratelog"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// MaxSinglePut is the largest object sent as one PUT. Larger ones go
// through multipart upload in parts of this size. KV chunks are a few to a
// few hundred MiB, so in practice every Put is one request.
const MaxSinglePut = 1 << 30

// maxRetries is minio-go's attempt count per request (1 would mean no
// retry): one retry rides over a connection the server closed. The
// manager treats a failed remote read as a miss and the circuit breaker
// handles an outage, so retrying hard here would only hold up the caller.
const maxRetries = 2

// Tier stores chunks as objects in one bucket. Besides tier.Tier it
// implements tier.PrefixContainer, tier.Remover, tier.StatsReporter,
// io.Closer, and remote.Pinger and remote.PresenceReporter for the circuit
// breaker. Object stores do not pin.
type Tier struct {
	cfg       Config
	client    *minio.Client
	core      minio.Core // same client; its GetObject returns the raw body
	transport *http.Transport
	known     *presence
	log       *slog.Logger
	logs      ratelog.Set // failed removes: one per chunk while the store is down
	closed    atomic.Bool

	hits, misses, puts, removes atomic.Uint64
	bytesRead, bytesWritten     atomic.Uint64
}

var (
	_ tier.Tier               = (*Tier)(nil)
	_ tier.PrefixContainer    = (*Tier)(nil)
	_ tier.Remover            = (*Tier)(nil)
	_ tier.StatsReporter      = (*Tier)(nil)
	_ io.Closer               = (*Tier)(nil)
	_ remote.Pinger           = (*Tier)(nil)
	_ remote.PresenceReporter = (*Tier)(nil)
)

// New connects to the store described by cfg and checks that its bucket is
// reachable with the given credentials, creating it if cfg.CreateBucket is
// set. Errors name the endpoint and bucket and keep the server's reason.
func New(ctx context.Context, cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	transport, err := minio.DefaultTransport(cfg.Secure)
	if err != nil {
		return nil, fmt.Errorf("s3: transport: %w", err)
	}
	// Keep enough idle connections for the manager's parallel fetches,
	// the asynchronous puts and PrefixContains' HEADs together, so a busy
	// moment does not end in a round of new TCP (and TLS) handshakes.
	transport.MaxIdleConnsPerHost = 64
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		Secure:       cfg.Secure,
		Transport:    transport,
		Region:       cfg.Region,
		BucketLookup: lookup,
		MaxRetries:   maxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("s3: endpoint %q: %w", cfg.Endpoint, err)
	}
	t := &Tier{
		cfg:       cfg,
		client:    client,
		core:      minio.Core{Client: client},
		transport: transport,
		known:     newPresence(cfg.CacheKeys),
		log:       cfg.Logger,
	}
	if err := t.ensureBucket(ctx); err != nil {
		transport.CloseIdleConnections()
		return nil, err
	}
	return t, nil
}

func (t *Tier) ensureBucket(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(openTimeout, t.cfg.Timeout))
	defer cancel()
	exists, err := t.client.BucketExists(ctx, t.cfg.Bucket)
	if err != nil {
		return t.bucketError(err)
	}
	if exists {
		return nil
	}
	if !t.cfg.CreateBucket {
		return fmt.Errorf("s3: bucket %q does not exist at %s (add create=true to the URL to create it)",
			t.cfg.Bucket, t.cfg.Endpoint)
	}
	err = t.client.MakeBucket(ctx, t.cfg.Bucket, minio.MakeBucketOptions{Region: t.cfg.Region})
	// Another node of ours may have created it in between. (The code
	// BucketAlreadyExists means some other account owns the name: an
	// error.)
	if minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("s3: create bucket %q at %s: %w", t.cfg.Bucket, t.cfg.Endpoint, err)
	}
	t.log.Info("created S3 bucket", "bucket", t.cfg.Bucket, "endpoint", t.cfg.Endpoint)
	return nil
}

func (t *Tier) bucketError(err error) error {
	return fmt.Errorf("s3: bucket %q at %s: %w", t.cfg.Bucket, t.cfg.Endpoint, err)
}

// Ping reports whether the bucket answers; the circuit breaker of package
// remote uses it as its health probe.
func (t *Tier) Ping(ctx context.Context) error {
	if t.closed.Load() {
		return tier.ErrClosed
	}
	ctx, cancel := t.bound(ctx, 0)
	defer cancel()
	exists, err := t.client.BucketExists(ctx, t.cfg.Bucket)
	if err != nil {
		return t.bucketError(err)
	}
	if !exists {
		return fmt.Errorf("s3: bucket %q at %s is gone", t.cfg.Bucket, t.cfg.Endpoint)
	}
	return nil
}

// Name implements tier.Tier.
func (t *Tier) Name() string { return "s3" }

// Size implements tier.Tier. Network errors count as absent.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	n, ok, _ := t.SizeErr(key)
	return n, ok
}

// SizeErr is Size with the error of a HEAD that failed for another reason
// than a missing object (remote.PresenceReporter).
func (t *Tier) SizeErr(key chunk.Key) (int, bool, error) {
	if t.closed.Load() {
		return 0, false, nil
	}
	if n, ok := t.known.size(key); ok {
		return int(n), true, nil
	}
	ctx, cancel := t.bound(context.Background(), 0)
	defer cancel()
	n, ok, err := t.stat(ctx, key)
	return int(n), ok, err
}

// stat asks the store whether key is there and remembers the answer when
// it is. Errors other than "not found" are logged and returned; they count
// as absent for callers whose contract has no error, since a miss is
// always safe.
func (t *Tier) stat(ctx context.Context, key chunk.Key) (int64, bool, error) {
	if n, ok := t.known.size(key); ok {
		return n, true, nil
	}
	name := objectName(t.cfg.Prefix, key)
	info, err := t.client.StatObject(ctx, t.cfg.Bucket, name, minio.StatObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return 0, false, nil
		}
		if t.log.Enabled(ctx, slog.LevelDebug) {
			t.log.Debug("s3 stat failed", "object", name, "err", err)
		}
		return 0, false, fmt.Errorf("s3: head %s: %w", name, err)
	}
	t.known.add(key, info.Size)
	return info.Size, true, nil
}

// PrefixContains implements tier.PrefixContainer: keys already known cost nothing,
// the rest are checked with concurrent HEADs and no HEAD is started for a
// key past the first one found missing.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	n, _ := t.PrefixContainsErr(keys)
	return n
}

// PrefixContainsErr is PrefixContains with the error of a HEAD that
// failed, if one did (remote.PresenceReporter).
func (t *Tier) PrefixContainsErr(keys []chunk.Key) (int, error) {
	if t.closed.Load() {
		return 0, nil
	}
	n := 0
	for n < len(keys) {
		if _, ok := t.known.size(keys[n]); !ok {
			break
		}
		n++
	}
	if n == len(keys) {
		return n, nil
	}
	m, err := t.statPrefix(keys[n:])
	return n + m, err
}

func (t *Tier) statPrefix(keys []chunk.Key) (int, error) {
	ctx, cancel := t.bound(context.Background(), 0)
	defer cancel()
	var next, firstMissing atomic.Int64
	var failed atomic.Pointer[error] // the first HEAD that failed
	firstMissing.Store(int64(len(keys)))
	var wg sync.WaitGroup
	for range min(t.cfg.Parallelism, len(keys)) {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= firstMissing.Load() {
					return
				}
				if _, ok, err := t.stat(ctx, keys[i]); !ok {
					if err != nil {
						failed.CompareAndSwap(nil, &err)
					}
					lowerTo(&firstMissing, i)
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return int(firstMissing.Load()), *err
	}
	return int(firstMissing.Load()), nil
}

// lowerTo sets v to i if i is smaller, safely against concurrent callers.
func lowerTo(v *atomic.Int64, i int64) {
	for {
		cur := v.Load()
		if i >= cur || v.CompareAndSwap(cur, i) {
			return
		}
	}
}

// Get implements tier.Tier with one GET whose body is read straight into
// dst. A missing object is forgotten from the presence cache.
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, tier.ErrClosed
	}
	ctx, cancel := t.bound(ctx, len(dst))
	defer cancel()
	name := objectName(t.cfg.Prefix, key)
	body, info, _, err := t.core.GetObject(ctx, t.cfg.Bucket, name, minio.GetObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			t.known.forget(key)
			t.misses.Add(1)
			return 0, fmt.Errorf("s3: get %s: %w", name, tier.ErrNotFound)
		}
		return 0, fmt.Errorf("s3: get %s: %w", name, err)
	}
	defer body.Close()
	if info.Size < 0 {
		// A chunked answer without Content-Length: S3 never sends one, and
		// without a length there is no telling a whole object from a cut one.
		return 0, fmt.Errorf("s3: get %s: server sent no Content-Length", name)
	}
	if info.Size > int64(len(dst)) {
		t.known.add(key, info.Size)
		return 0, fmt.Errorf("s3: get %s: object of %d bytes, destination of %d: %w",
			name, info.Size, len(dst), tier.ErrTooLarge)
	}
	// The transport stops the body at its Content-Length, which is
	// info.Size, so a short read is the only way this can go wrong.
	n, err := io.ReadFull(body, dst[:info.Size])
	if err != nil {
		return 0, fmt.Errorf("s3: get %s: read %d of %d bytes: %w", name, n, info.Size, err)
	}
	t.known.add(key, info.Size)
	t.hits.Add(1)
	t.bytesRead.Add(uint64(n))
	return n, nil
}

// Put implements tier.Tier. The upload is skipped when the key is known
// present or a HEAD finds it: same key, same bytes.
func (t *Tier) Put(ctx context.Context, key chunk.Key, data []byte) error {
	if t.closed.Load() {
		return tier.ErrClosed
	}
	if _, ok := t.known.size(key); ok {
		return nil
	}
	ctx, cancel := t.bound(ctx, len(data))
	defer cancel()
	if _, ok, _ := t.stat(ctx, key); ok {
		return nil
	}
	name := objectName(t.cfg.Prefix, key)
	_, err := t.client.PutObject(ctx, t.cfg.Bucket, name, bytes.NewReader(data), int64(len(data)), putOptions)
	if err != nil {
		return fmt.Errorf("s3: put %s (%d bytes): %w", name, len(data), err)
	}
	t.known.add(key, int64(len(data)))
	t.puts.Add(1)
	t.bytesWritten.Add(uint64(len(data)))
	return nil
}

// putOptions send an object of known length as one PUT with an unsigned
// payload: by default minio-go would either split it into 16 MiB multipart
// parts or, over plain HTTP, SHA-256 the whole body to sign it chunk by
// chunk, which costs more CPU than moving the bytes.
var putOptions = minio.PutObjectOptions{
	PartSize:             MaxSinglePut,
	DisableContentSha256: true,
	ContentType:          "application/octet-stream",
}

// Remove implements tier.Remover. S3 deletes succeed whether or not the object
// existed, so a HEAD first tells which it was.
func (t *Tier) Remove(key chunk.Key) bool {
	if t.closed.Load() {
		return false
	}
	t.known.forget(key)
	ctx, cancel := t.bound(context.Background(), 0)
	defer cancel()
	name := objectName(t.cfg.Prefix, key)
	if _, err := t.client.StatObject(ctx, t.cfg.Bucket, name, minio.StatObjectOptions{}); err != nil {
		return false
	}
	if err := t.client.RemoveObject(ctx, t.cfg.Bucket, name, minio.RemoveObjectOptions{}); err != nil {
		t.logs.Log(t.log, slog.LevelWarn, "s3 remove failed", "object", name, "err", err)
		return false
	}
	t.removes.Add(1)
	return true
}

var _ remote.DamageRemover = (*Tier)(nil)

// RemoveDamaged implements remote.DamageRemover. S3 offers no conditional
// delete through its client, so the delete is unconditional once a HEAD
// finds an object of the damaged length (a length that differs, or no
// object, means it was replaced or is gone: it stays). The trade: another
// reader may have removed the damaged object and a writer stored a good
// one since the damaged read, and this deletes the good one. Chunk keys
// are content hashes of the tokens, so every object under a key holds the
// same KV: that costs at most one more store of identical bytes, while a
// damaged object that stayed would never heal (Put keeps an existing
// object) and would keep counting against the store.
func (t *Tier) RemoveDamaged(key chunk.Key, d remote.Damage) remote.Removal {
	if t.closed.Load() {
		return remote.DamageKept
	}
	t.known.forget(key)
	ctx, cancel := t.bound(context.Background(), 0)
	defer cancel()
	name := objectName(t.cfg.Prefix, key)
	info, err := t.client.StatObject(ctx, t.cfg.Bucket, name, minio.StatObjectOptions{})
	switch {
	case isNotFound(err):
		return remote.DamageGone
	case err != nil:
		return remote.DamageKept
	case d.Size >= 0 && info.Size != int64(d.Size):
		return remote.DamageGone // replaced
	}
	if err := t.client.RemoveObject(ctx, t.cfg.Bucket, name, minio.RemoveObjectOptions{}); err != nil {
		t.logs.Log(t.log, slog.LevelWarn, "s3 remove of a damaged object failed", "object", name, "err", err)
		return remote.DamageKept
	}
	t.removes.Add(1)
	return remote.DamageRemoved
}

// Stats implements tier.StatsReporter. Capacity, Used and Objects are unknown to a
// client of a shared bucket and stay zero.
func (t *Tier) Stats() tier.Stats {
	return tier.Stats{
		Name:         t.Name(),
		Hits:         t.hits.Load(),
		Misses:       t.misses.Load(),
		Puts:         t.puts.Load(),
		Removes:      t.removes.Load(),
		BytesRead:    t.bytesRead.Load(),
		BytesWritten: t.bytesWritten.Load(),
	}
}

// Close implements io.Closer. Later calls fail with tier.ErrClosed; idle
// connections are closed, requests in flight finish on their own.
func (t *Tier) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.transport.CloseIdleConnections()
	return nil
}

// bound applies the deadline of an operation that moves n bytes to ctx.
func (t *Tier) bound(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, remote.CallDeadline(t.cfg.Timeout, t.cfg.Bandwidth, n))
}

// isNotFound tells a missing object from every other failure. It trusts
// only the NoSuchKey code (which minio-go also assigns to a bodiless 404
// answer to a HEAD of an object): some servers answer 404 for other
// things, such as versitygw for an unknown access key, and neither that
// nor a missing bucket may read as an endless run of cache misses.
func isNotFound(err error) bool {
	return minio.ToErrorResponse(err).Code == minio.NoSuchKey
}

// objectName renders key as prefix + 16 hex digits of scope + 32 of hash.
func objectName(prefix string, key chunk.Key) string {
	var buf [8 + 16]byte
	for i := range 8 {
		buf[i] = byte(key.Scope >> (56 - 8*i))
	}
	copy(buf[8:], key.Hash[:])
	var hexed [2 * len(buf)]byte
	hex.Encode(hexed[:], buf[:])
	var b strings.Builder
	b.Grow(len(prefix) + len(hexed))
	b.WriteString(prefix)
	b.Write(hexed[:])
	return b.String()
}
