package s3

import (
	"context"
	"net/url"

	"kvtier/tier"
	"kvtier/tier/remote"
)

func init() { remote.Register("s3", Open) }

// Open is the remote.OpenFunc of the "s3" scheme: it parses u as described
// in the package comment and connects.
func Open(ctx context.Context, u *url.URL, o remote.Options) (tier.Tier, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.Timeout, cfg.Bandwidth, cfg.Logger = o.Timeout, o.Bandwidth, o.Logger
	t, err := New(ctx, cfg)
	if err != nil {
		return nil, err // not a typed nil inside a non-nil tier.Tier
	}
	return t, nil
}
