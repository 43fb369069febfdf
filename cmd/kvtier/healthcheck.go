package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthURL is the daemon's liveness probe at its default
// admin_addr.
const defaultHealthURL = "http://127.0.0.1:7480/healthz"

// healthcheckCmd probes a kvtier HTTP endpoint and exits non-zero unless it
// answers 2xx. Container images built on distroless or scratch have no
// curl or wget, so the binary probes itself (Docker's HEALTHCHECK).
func healthcheckCmd() *cobra.Command {
	var (
		target  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "probe a kvtier health endpoint; exit 0 on a 2xx answer",
		Long: `Send GET --url and exit 0 if the answer's status is 2xx, 1 otherwise (no
answer within --timeout, a refused connection, another status). Meant for
container HEALTHCHECKs, where no curl is installed: the daemon's probes are
/healthz and /readyz on admin_addr, the controller's /healthz on listen.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return probe(cmd.Context(), target, timeout, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&target, "url", defaultHealthURL, "the endpoint to GET (http:// or https://)")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}

// probe GETs target within timeout and reports any answer but a 2xx as an
// error. The body is read only up to a small bound: a probe must not hang
// on, or buffer, an endless answer.
func probe(ctx context.Context, target string, timeout time.Duration, out io.Writer) error {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q: want http://host:port/path or https://…", target)
	}
	if timeout <= 0 {
		return fmt.Errorf("--timeout %v: want more than 0", timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("--url %q: %w", target, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: %s %q", target, resp.Status, body)
	}
	fmt.Fprintf(out, "%s: %s\n", target, resp.Status)
	return nil
}
