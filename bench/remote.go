package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/redis"
	"kvtier/tier/remote"
	"kvtier/tier/s3"
)

// RemoteReport compares one remote tier with the plain client library
// doing the same transfers against the same server in the same run.
type RemoteReport struct {
	URL          string  `json:"url"`
	ChunkBytes   int     `json:"chunk_bytes"`
	N            int     `json:"chunks"`
	TierPutGBps  float64 `json:"tier_put_gbps"`
	TierGetGBps  float64 `json:"tier_get_gbps"`
	RawPutGBps   float64 `json:"raw_put_gbps"`
	RawGetGBps   float64 `json:"raw_get_gbps"`
	PutRatio     float64 `json:"put_ratio"`
	GetRatio     float64 `json:"get_ratio"`
	BaselineNote string  `json:"baseline"`
}

// benchRemote times n Puts and Gets of one chunk through the tier (no
// breaker, no codec: the backend alone), then the raw baseline.
func benchRemote(ctx context.Context, rawURL string, data []byte, n int) (*RemoteReport, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("--remote: %s", remote.Redact(rawURL))
	}
	r := &RemoteReport{URL: remote.Redact(rawURL), ChunkBytes: len(data), N: n}
	t, err := remote.Open(ctx, rawURL, remote.Options{Timeout: time.Minute})
	if err != nil {
		return nil, err
	}
	defer tier.Close(t)
	keys := make([]chunk.Key, n)
	stamp := uint64(time.Now().UnixNano())
	for i := range keys {
		keys[i] = chunk.Key{Scope: 0xbe4c, Hash: chunk.Hash{byte(i), byte(i >> 8)}}
		copy(keys[i].Hash[8:], fmt.Sprint(stamp))
	}
	total := int64(n * len(data))
	var opErr error
	r.TierPutGBps = bestOf(1, total, func() error {
		for _, k := range keys {
			if opErr = t.Put(ctx, k, data); opErr != nil {
				return opErr
			}
		}
		return nil
	})
	dst := make([]byte, len(data))
	r.TierGetGBps = bestOf(1, total, func() error {
		for _, k := range keys {
			if _, opErr = t.Get(ctx, k, dst); opErr != nil {
				return opErr
			}
		}
		return nil
	})
	if opErr != nil {
		return nil, opErr
	}
	if !bytes.Equal(dst, data) {
		return nil, fmt.Errorf("remote bench: the tier returned different bytes")
	}
	for _, k := range keys {
		tier.Remove(t, k)
	}
	if err := rawRemote(ctx, u, data, n, r); err != nil {
		return nil, err
	}
	r.PutRatio = r.TierPutGBps / r.RawPutGBps
	r.GetRatio = r.TierGetGBps / r.RawGetGBps
	return r, nil
}

// rawRemote measures the baseline: the backend's own client library.
func rawRemote(ctx context.Context, u *url.URL, data []byte, n int, r *RemoteReport) error {
	switch scheme := strings.ToLower(u.Scheme); {
	case strings.HasPrefix(scheme, "redis") || strings.HasPrefix(scheme, "rediss") || strings.HasPrefix(scheme, "valkey"):
		b, err := redis.RawBaseline(ctx, u, data, n)
		if err != nil {
			return err
		}
		r.RawPutGBps = float64(b.Bytes*b.N) / b.Set.Seconds() / 1e9
		r.RawGetGBps = float64(b.Bytes*b.N) / b.Get.Seconds() / 1e9
		r.BaselineNote = "go-redis SET and GET of the same bytes"
		return nil
	case scheme == "s3":
		return rawS3(ctx, u, data, n, r)
	}
	return fmt.Errorf("--remote: no raw baseline for scheme %q (redis and s3 have one)", u.Scheme)
}

// rawS3 times minio-go PutObject and GetObject+ReadFull of the same bytes,
// with the options a plain user would pass for a known-size object.
func rawS3(ctx context.Context, u *url.URL, data []byte, n int, r *RemoteReport) error {
	cfg, err := s3.ParseURL(u)
	if err != nil {
		return err
	}
	mc, err := minio.New(cfg.Endpoint, &minio.Options{Secure: cfg.Secure, Region: cfg.Region,
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		BucketLookup: map[bool]minio.BucketLookupType{true: minio.BucketLookupPath, false: minio.BucketLookupAuto}[cfg.PathStyle]})
	if err != nil {
		return err
	}
	name := func(i int) string { return fmt.Sprintf("%sbench-raw-%d", cfg.Prefix, i) }
	total := int64(n * len(data))
	var opErr error
	r.RawPutGBps = bestOf(1, total, func() error {
		for i := range n {
			_, opErr = mc.PutObject(ctx, cfg.Bucket, name(i), bytes.NewReader(data), int64(len(data)),
				minio.PutObjectOptions{PartSize: 1 << 30, DisableContentSha256: true})
			if opErr != nil {
				return opErr
			}
		}
		return nil
	})
	dst := make([]byte, len(data))
	r.RawGetGBps = bestOf(1, total, func() error {
		for i := range n {
			obj, err := mc.GetObject(ctx, cfg.Bucket, name(i), minio.GetObjectOptions{})
			if err != nil {
				opErr = err
				return err
			}
			_, opErr = io.ReadFull(obj, dst)
			obj.Close()
			if opErr != nil {
				return opErr
			}
		}
		return nil
	})
	for i := range n {
		mc.RemoveObject(ctx, cfg.Bucket, name(i), minio.RemoveObjectOptions{})
	}
	r.BaselineNote = "minio-go PutObject (one unsigned PUT) and GetObject+ReadFull of the same bytes"
	return opErr
}

// benchCodecs measures every codec on synthetic KV of the bench's chunk
// shape (see codec.SyntheticKV: per-channel Gaussian values with outlier
// channels, rounded to the dtype — not real model KV).
func benchCodecs(f Options, dt kvformat.DType) ([]codec.Report, error) {
	spec := kvformat.Spec{Layers: f.Layers, KVHeads: f.Heads, HeadDim: f.HeadDim, DType: dt,
		Layout: kvformat.Layout2LTD, ChunkTokens: f.Tokens}
	data := codec.SyntheticKV(spec, f.Tokens, 1)
	var out []codec.Report
	for _, name := range codec.Names() {
		c, err := codec.Lookup(name)
		if err != nil {
			return nil, err
		}
		if !c.Lossless() && dt != kvformat.Float16 && dt != kvformat.BFloat16 {
			continue
		}
		rep, err := codec.Measure(c, spec, data)
		if err != nil {
			return nil, fmt.Errorf("codec %s: %w", name, err)
		}
		out = append(out, rep)
	}
	return out, nil
}

func printRemoteAndCodecs(w io.Writer, r *Report) {
	for _, x := range r.Remote {
		fmt.Fprintf(w, "\nremote tier %s, %d × %d-byte chunks (baseline: %s):\n", x.URL, x.N, x.ChunkBytes, x.BaselineNote)
		fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "put", x.TierPutGBps, x.RawPutGBps, x.PutRatio)
		fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "get", x.TierGetGBps, x.RawGetGBps, x.GetRatio)
	}
	if len(r.Codecs) > 0 {
		fmt.Fprintf(w, "\ncodecs on synthetic KV of the chunk's shape (per-channel Gaussian with outlier channels; not model output):\n")
		fmt.Fprintf(w, "%-8s %8s %12s %12s %12s %12s\n", "codec", "ratio", "encode GB/s", "decode GB/s", "max rel err", "mean rel err")
		for _, c := range r.Codecs {
			fmt.Fprintf(w, "%-8s %8.3f %12.2f %12.2f %12.4f %12.4f\n", c.Codec, c.Ratio, c.EncodeGBps, c.DecodeGBps, c.MaxRelErr, c.MeanRelErr)
		}
	}
}

var _ tier.Tier = (*remote.Encoded)(nil)
