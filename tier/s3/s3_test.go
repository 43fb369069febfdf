package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

func testKey(i int) chunk.Key {
	var k chunk.Key
	k.Scope = 0x0123456789abcdef
	k.Hash[0] = byte(i >> 8)
	k.Hash[1] = byte(i)
	k.Hash[15] = 0x5a
	return k
}

// payload returns n pseudo-random bytes that differ per seed.
func payload(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestObjectName(t *testing.T) {
	k := chunk.Key{Scope: 0x00000000000000ff}
	k.Hash[0], k.Hash[15] = 0xab, 0x01
	got := objectName("kvtier/", k)
	want := "kvtier/00000000000000ff" + "ab000000000000000000000000000001"
	if got != want {
		t.Fatalf("objectName = %q, want %q", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	srv := sharedServer(t)
	tr := srv.open(t, bucketName(t))
	sizes := []int{0, 1, 3<<20 + 5, 9 << 20}
	for i, n := range sizes {
		data := payload(uint64(i), n)
		if err := tr.Put(context.Background(), testKey(i), data); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
	}
	// A second tier on the same bucket has an empty presence cache, so
	// every answer below comes from the server.
	fresh := srv.open(t, bucketName(t))
	for _, reader := range []*Tier{tr, fresh} {
		for i, n := range sizes {
			k := testKey(i)
			if got, ok := reader.Size(k); !ok || got != n {
				t.Fatalf("Size(%d) = %d, %v; want %d, true", i, got, ok, n)
			}
			if !tier.Contains(reader, k) {
				t.Fatalf("Contains(%d) = false", i)
			}
			dst := make([]byte, n+100)
			got, err := reader.Get(context.Background(), k, dst)
			if err != nil {
				t.Fatalf("get %d: %v", i, err)
			}
			if got != n || !bytes.Equal(dst[:got], payload(uint64(i), n)) {
				t.Fatalf("get %d: %d bytes, or bytes differ from the %d written", i, got, n)
			}
		}
	}
	st := tr.Stats()
	total := uint64(0)
	for _, n := range sizes {
		total += uint64(n)
	}
	if st.Puts != uint64(len(sizes)) || st.BytesWritten != total || st.Hits != uint64(len(sizes)) || st.BytesRead != total {
		t.Fatalf("stats %+v; want %d puts and hits of %d bytes each way", st, len(sizes), total)
	}
}

func TestMissingKey(t *testing.T) {
	srv := sharedServer(t)
	tr := srv.open(t, bucketName(t))
	k := testKey(1)
	if tier.Contains(tr, k) {
		t.Fatal("Contains of a missing key = true")
	}
	if n, ok := tr.Size(k); ok {
		t.Fatalf("Size of a missing key = %d, true", n)
	}
	if _, err := tr.Get(context.Background(), k, make([]byte, 10)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	if tr.Remove(k) {
		t.Fatal("Remove of a missing key = true")
	}
	if st := tr.Stats(); st.Misses != 1 || st.Hits != 0 {
		t.Fatalf("stats %+v, want one miss", st)
	}
}

func TestShortDestination(t *testing.T) {
	srv := sharedServer(t)
	tr := srv.open(t, bucketName(t))
	data := payload(3, 1<<20)
	if err := tr.Put(context.Background(), testKey(0), data); err != nil {
		t.Fatal(err)
	}
	_, err := tr.Get(context.Background(), testKey(0), make([]byte, len(data)-1))
	if !errors.Is(err, tier.ErrTooLarge) {
		t.Fatalf("Get into a short buffer: %v, want ErrTooLarge", err)
	}
}

func TestPutExistingIsNoop(t *testing.T) {
	srv := sharedServer(t)
	first := srv.open(t, bucketName(t))
	k := testKey(9)
	want := payload(1, 2<<20)
	if err := first.Put(context.Background(), k, want); err != nil {
		t.Fatal(err)
	}
	// Another node (a fresh tier) putting the key again must succeed and
	// leave the stored object alone.
	second := srv.open(t, bucketName(t))
	if err := second.Put(context.Background(), k, payload(2, 1<<20)); err != nil {
		t.Fatalf("second put: %v", err)
	}
	if st := second.Stats(); st.Puts != 0 {
		t.Fatalf("second put uploaded (%d puts)", st.Puts)
	}
	got := make([]byte, len(want))
	n, err := second.Get(context.Background(), k, got)
	if err != nil || n != len(want) || !bytes.Equal(got, want) {
		t.Fatalf("after second put: %d bytes, err %v; want the first object", n, err)
	}
}

func TestPrefixContains(t *testing.T) {
	srv := sharedServer(t)
	writer := srv.open(t, bucketName(t))
	const n = 40
	keys := make([]chunk.Key, n)
	for i := range keys {
		keys[i] = testKey(i)
	}
	const hole = 27
	for i, k := range keys {
		if i == hole {
			continue
		}
		if err := writer.Put(context.Background(), k, payload(uint64(i), 1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		keys []chunk.Key
		want int
	}{
		{"empty", nil, 0},
		{"up to the hole", keys, hole},
		{"before the hole", keys[:hole], hole},
		{"starting at the hole", keys[hole:], 0},
		{"after the hole", keys[hole+1:], n - hole - 1},
		{"one", keys[:1], 1},
	}
	for _, c := range cases {
		// A fresh tier for each case: nothing known, every key is a HEAD.
		reader := srv.open(t, bucketName(t))
		if got := reader.PrefixContains(c.keys); got != c.want {
			t.Errorf("%s: PrefixContains = %d, want %d", c.name, got, c.want)
		}
		// The keys it found are now known, with their sizes.
		for i := range c.want {
			if size, ok := reader.known.size(c.keys[i]); !ok || size <= 0 {
				t.Errorf("%s: key %d not remembered after PrefixContains", c.name, i)
			}
		}
	}
	// The writer knows every key it put; the hole still needs a HEAD.
	if got := writer.PrefixContains(keys); got != hole {
		t.Fatalf("writer's PrefixContains = %d, want %d", got, hole)
	}
}

func TestRemove(t *testing.T) {
	srv := sharedServer(t)
	tr := srv.open(t, bucketName(t))
	k := testKey(4)
	if err := tr.Put(context.Background(), k, []byte("chunk")); err != nil {
		t.Fatal(err)
	}
	if !tr.Remove(k) {
		t.Fatal("Remove of a stored key = false")
	}
	if tier.Contains(tr, k) {
		t.Fatal("Contains after Remove = true")
	}
	// A put after a remove must upload again, not trust a stale memory.
	if err := tr.Put(context.Background(), k, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if n, ok := tr.Size(k); !ok || n != len("again") {
		t.Fatalf("Size after re-put = %d, %v", n, ok)
	}
}

// TestStaleKnownKey deletes an object behind the tier's back: the tier may
// still claim it, but Get reports ErrNotFound and the tier then forgets it.
func TestStaleKnownKey(t *testing.T) {
	srv := sharedServer(t)
	bucket := bucketName(t)
	tr := srv.open(t, bucket)
	k := testKey(5)
	if err := tr.Put(context.Background(), k, []byte("soon gone")); err != nil {
		t.Fatal(err)
	}
	raw := srv.rawClient(t)
	if err := raw.RemoveObject(context.Background(), bucket, objectName(DefaultPrefix, k), minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(context.Background(), k, make([]byte, 64)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of a deleted object: %v, want ErrNotFound", err)
	}
	if tier.Contains(tr, k) {
		t.Fatal("Contains after a failed Get = true; the stale entry was kept")
	}
}

// TestForeignObject writes an object with plain minio-go under a key's
// name: the tier serves its bytes and size like its own.
func TestForeignObject(t *testing.T) {
	srv := sharedServer(t)
	bucket := bucketName(t)
	tr := srv.open(t, bucket)
	k := testKey(77)
	data := payload(77, 5<<20+7)
	raw := srv.rawClient(t)
	_, err := raw.PutObject(context.Background(), bucket, objectName(DefaultPrefix, k),
		bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.PrefixContains([]chunk.Key{k, testKey(78)}); got != 1 {
		t.Fatalf("PrefixContains = %d, want 1", got)
	}
	if n, ok := tr.Size(k); !ok || n != len(data) {
		t.Fatalf("Size = %d, %v; want %d", n, ok, len(data))
	}
	dst := make([]byte, len(data))
	n, err := tr.Get(context.Background(), k, dst)
	if err != nil || n != len(data) || !bytes.Equal(dst, data) {
		t.Fatalf("Get: %d bytes, err %v; want the %d bytes written", n, err, len(data))
	}
}

// TestConcurrentWritersSameKey races writers of one key, through separate
// tiers and through raw overwrites, against readers: every successful read
// must be exactly one writer's object.
func TestConcurrentWritersSameKey(t *testing.T) {
	srv := sharedServer(t)
	bucket := bucketName(t)
	const (
		writers = 4
		rounds  = 6
		readers = 3
		size    = 2<<20 + 3
	)
	k := testKey(100)
	name := objectName(DefaultPrefix, k)
	raw := srv.rawClient(t)
	tiers := make([]*Tier, writers+readers)
	for i := range tiers {
		tiers[i] = srv.open(t, bucket)
	}
	// Each writer's object is its id in every byte, so a mix of two
	// writes shows as two different byte values.
	objects := make([][]byte, writers)
	for w := range objects {
		objects[w] = bytes.Repeat([]byte{byte(w + 1)}, size)
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, writers+readers)
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				var err error
				if r%2 == 0 {
					err = tiers[w].Put(context.Background(), k, objects[w])
				} else {
					_, err = raw.PutObject(context.Background(), bucket, name,
						bytes.NewReader(objects[w]), size, minio.PutObjectOptions{})
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		})
	}
	reads := make([]int, readers)
	var rg sync.WaitGroup
	for r := range readers {
		rg.Go(func() {
			dst := make([]byte, size)
			for {
				select {
				case <-done:
					return
				default:
				}
				n, err := tiers[writers+r].Get(context.Background(), k, dst)
				if errors.Is(err, tier.ErrNotFound) {
					continue // no write has finished yet
				}
				if err != nil {
					errs <- fmt.Errorf("reader %d: %w", r, err)
					return
				}
				if n != size || bytes.Count(dst, dst[:1]) != size || dst[0] < 1 || int(dst[0]) > writers {
					errs <- fmt.Errorf("reader %d: read of %d bytes is not one writer's whole object", r, n)
					return
				}
				reads[r]++
			}
		})
	}
	wg.Wait()
	close(done)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// One last read after all writes is whole as well.
	dst := make([]byte, size)
	n, err := tiers[writers].Get(context.Background(), k, dst)
	if err != nil || n != size || bytes.Count(dst, dst[:1]) != size {
		t.Fatalf("final read: %d bytes, err %v", n, err)
	}
	t.Logf("reads per reader: %v", reads)
}

// TestServerRestart stops the server under a tier: calls fail with errors
// (never a panic, never a false hit) and work again once it is back.
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	cfg := srv.config("restart")
	cfg.Timeout = 3 * time.Second
	tr := srv.openConfig(t, cfg)
	ctx := context.Background()
	before := payload(1, 1<<20)
	if err := tr.Put(ctx, testKey(1), before); err != nil {
		t.Fatal(err)
	}

	srv.kill()
	if err := tr.Ping(ctx); err == nil {
		t.Fatal("Ping with the server down succeeded")
	}
	if err := tr.Put(ctx, testKey(2), payload(2, 1<<20)); err == nil {
		t.Fatal("Put with the server down succeeded")
	}
	dst := make([]byte, 1<<20)
	if _, err := tr.Get(ctx, testKey(1), dst); err == nil || errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get with the server down: %v, want a transport error", err)
	}
	if tier.Contains(tr, testKey(3)) || tr.PrefixContains([]chunk.Key{testKey(3)}) != 0 {
		t.Fatal("an unknown key reads as present with the server down")
	}

	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Ping(ctx); err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
	n, err := tr.Get(ctx, testKey(1), dst)
	if err != nil || !bytes.Equal(dst[:n], before) {
		t.Fatalf("Get after restart: %d bytes, err %v", n, err)
	}
	if err := tr.Put(ctx, testKey(2), payload(2, 1<<20)); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
	if got := tr.PrefixContains([]chunk.Key{testKey(1), testKey(2), testKey(3)}); got != 2 {
		t.Fatalf("PrefixContains after restart = %d, want 2", got)
	}
}

func TestClosed(t *testing.T) {
	srv := sharedServer(t)
	tr := srv.open(t, bucketName(t))
	k := testKey(1)
	if err := tr.Put(context.Background(), k, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(context.Background(), testKey(2), []byte("x")); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, err := tr.Get(context.Background(), k, make([]byte, 1)); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := tr.Ping(context.Background()); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if tier.Contains(tr, k) || tr.PrefixContains([]chunk.Key{k}) != 0 || tr.Remove(k) {
		t.Fatal("a closed tier still answers")
	}
}

func TestOpenThroughRegistry(t *testing.T) {
	srv := sharedServer(t)
	raw := srv.url(bucketName(t), "some/prefix")
	tr, err := remote.Open(context.Background(), raw, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close(tr)
	s3t, ok := tr.(*Tier)
	if !ok {
		t.Fatalf("remote.Open returned %T", tr)
	}
	if s3t.cfg.Prefix != "some/prefix/" || s3t.cfg.SecretKey != testSecret {
		t.Fatalf("prefix %q, secret %q: URL not decoded as written", s3t.cfg.Prefix, s3t.cfg.SecretKey)
	}
	if err := tr.Put(context.Background(), testKey(1), []byte("via registry")); err != nil {
		t.Fatal(err)
	}
	objects := srv.rawClient(t).ListObjects(context.Background(), bucketName(t),
		minio.ListObjectsOptions{Prefix: "some/prefix/", Recursive: true})
	var names []string
	for o := range objects {
		names = append(names, o.Key)
	}
	if want := objectName("some/prefix/", testKey(1)); len(names) != 1 || names[0] != want {
		t.Fatalf("objects in bucket %v, want [%s]", names, want)
	}
}

func TestBadCredentials(t *testing.T) {
	srv := sharedServer(t)
	cases := []struct {
		name, access, secret string
		codes                []string // AWS's code, and versitygw's where it differs
	}{
		{"wrong secret", testAccess, "not-the-secret", []string{"SignatureDoesNotMatch"}},
		{"unknown access key", "nobody", testSecret, []string{"InvalidAccessKeyId", "XAdminUserNotFound"}},
	}
	for _, c := range cases {
		cfg := srv.config(bucketName(t))
		cfg.AccessKey, cfg.SecretKey = c.access, c.secret
		_, err := New(context.Background(), cfg)
		if err == nil {
			t.Fatalf("%s: New succeeded", c.name)
		}
		resp := minio.ToErrorResponse(errors.Unwrap(err))
		if !slices.Contains(c.codes, resp.Code) {
			t.Errorf("%s: server said %q, want one of %q (error: %v)", c.name, resp.Code, c.codes, err)
		}
		if !strings.Contains(err.Error(), srv.addr) || !strings.Contains(err.Error(), cfg.Bucket) {
			t.Errorf("%s: error %q does not name the endpoint and bucket", c.name, err)
		}
	}
	// Through the registry, the password never shows in the error.
	u, _ := url.Parse(srv.url(bucketName(t), ""))
	u.User = url.UserPassword(testAccess, "wrong-secret-xyz")
	_, err := remote.Open(context.Background(), u.String(), remote.Options{})
	if err == nil || strings.Contains(err.Error(), "wrong-secret-xyz") {
		t.Fatalf("remote.Open with a wrong secret: %v", err)
	}
}

func TestMissingBucket(t *testing.T) {
	srv := sharedServer(t)
	cfg := srv.config(bucketName(t))
	cfg.CreateBucket = false
	_, err := New(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "create=true") {
		t.Fatalf("New on a missing bucket: %v", err)
	}
}

func TestNothingListening(t *testing.T) {
	cfg := Config{
		Bucket: "bkt", Endpoint: freeAddr(t), PathStyle: true,
		AccessKey: "a", SecretKey: "s", Timeout: 5 * time.Second,
	}
	_, err := New(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), cfg.Endpoint) {
		t.Fatalf("New with nothing listening: %v", err)
	}
}
