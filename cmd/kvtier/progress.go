package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// progressBar draws a one-line bar on a terminal, and on anything else a
// line every 10 %, so logs in CI stay short.
type progressBar struct {
	w        io.Writer
	enabled  bool
	terminal bool
	start    time.Time
	last     time.Time
	lastPct  int
}

func newProgressBar(w io.Writer, enabled bool) *progressBar {
	p := &progressBar{w: w, enabled: enabled, start: time.Now(), lastPct: -1}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.terminal = err == nil
	}
	return p
}

func (p *progressBar) update(done, total int) {
	if !p.enabled || total == 0 {
		return
	}
	pct := done * 100 / total
	if p.terminal {
		if time.Since(p.last) < 100*time.Millisecond && done != total {
			return
		}
		p.last = time.Now()
		const width = 40
		fill := done * width / total
		fmt.Fprintf(p.w, "\r[%s%s] %3d%% %d/%d requests, %s", strings.Repeat("#", fill), strings.Repeat(".", width-fill),
			pct, done, total, time.Since(p.start).Truncate(time.Second))
		return
	}
	if pct/10 != p.lastPct/10 || done == total {
		p.lastPct = pct
		fmt.Fprintf(p.w, "replay: %3d%% (%d/%d requests, %s)\n", pct, done, total, time.Since(p.start).Truncate(time.Second))
	}
}

func (p *progressBar) done() {
	if p.enabled && p.terminal {
		fmt.Fprintln(p.w)
	}
}
