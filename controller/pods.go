package controller

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"kvtier/router/ingest"
)

// podSpec matches NAME=MODEL=ADDRESS[=REPLAY]. The model is everything
// between the first '=' and the '=' that starts the address, so it may hold
// '/', '@' or even '='; addresses never contain '='.
var podSpec = regexp.MustCompile(`^([^=]+)=(.+?)=((?:tcp|ipc)://[^=]+)(?:=((?:tcp|ipc)://[^=]+))?$`)

// loadPods returns the pods of the configuration and of its pods file
// together, and the file's content they were read from.
func loadPods(specs []string, file string) ([]ingest.Endpoint, []byte, error) {
	specs = append([]string(nil), specs...)
	var data []byte
	if file != "" {
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", which("pods_file"), err)
		}
		lines, err := podsFileLines(file, data)
		if err != nil {
			return nil, nil, err
		}
		specs = append(specs, lines...)
	}
	eps, err := parsePods(specs)
	return eps, data, err
}

// podsFileLines returns the pod specs of a pods file: its lines without
// blank lines and # comments.
func podsFileLines(path string, data []byte) ([]string, error) {
	if len(data) > 4<<20 {
		return nil, fmt.Errorf("%s %s: %d bytes, more than 4 MiB", which("pods_file"), path, len(data))
	}
	var specs []string
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			specs = append(specs, line)
		}
	}
	return specs, nil
}

// podsFilePoll is how often the pods file is checked for changes.
var podsFilePoll = 2 * time.Second

// watchPods re-reads the pods file whenever its content changes and
// updates the subscriptions. A file that does not parse is reported and
// ignored: the pods followed so far stay as they are.
// loaded is the file's content the current pods came from: a change made
// since is picked up on the first tick.
func watchPods(ctx context.Context, specs []string, file string, loaded []byte, sub *ingest.Subscriber, log *slog.Logger) {
	last := loaded
	tick := time.NewTicker(podsFilePoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		data, err := os.ReadFile(file)
		if err != nil {
			if last != nil { // say it once, not every tick
				log.Warn("pods file unreadable; keeping the current pods", "file", file, "err", err)
				last = nil
			}
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		if n, err := reloadPods(specs, file, data, sub); err != nil {
			log.Error("pods file rejected; keeping the current pods", "file", file, "err", err)
		} else {
			log.Info("pods file reloaded", "file", file, "pods", n)
		}
	}
}

// reloadPods subscribes to the pods of specs and of the pods file's new
// content, and returns how many there are.
func reloadPods(specs []string, file string, data []byte, sub *ingest.Subscriber) (int, error) {
	lines, err := podsFileLines(file, data)
	if err != nil {
		return 0, err
	}
	eps, err := parsePods(append(append([]string(nil), specs...), lines...))
	if err != nil {
		return 0, err
	}
	return len(eps), sub.Update(eps)
}

// parsePods turns pod specs into ingest endpoints.
func parsePods(specs []string) ([]ingest.Endpoint, error) {
	// No pods is valid: the controller may serve registered daemons only.
	seen := make(map[string]bool, len(specs))
	eps := make([]ingest.Endpoint, 0, len(specs))
	for _, spec := range specs {
		m := podSpec.FindStringSubmatch(spec)
		if m == nil {
			return nil, fmt.Errorf("pod %q: want NAME=MODEL=tcp://HOST:PORT[=tcp://HOST:REPLAY_PORT]", spec)
		}
		if seen[m[1]] {
			return nil, fmt.Errorf("pod %q: pod %q given twice", spec, m[1])
		}
		seen[m[1]] = true
		eps = append(eps, ingest.Endpoint{Pod: m[1], Model: m[2], Address: m[3], Replay: m[4]})
	}
	return eps, nil
}
