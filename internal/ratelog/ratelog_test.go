package ratelog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// fakeClock drives a Limiter by hand: the time moves only when told, and
// the summary timer runs only when the test fires it.
type fakeClock struct {
	t       time.Time
	pending func()
	armed   int // timers armed
}

func newLimiter(every time.Duration) (*Limiter, *fakeClock, *bytes.Buffer) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	l := New(log, slog.LevelWarn, "write failed", every)
	c := &fakeClock{t: time.Unix(1000, 0)}
	l.now = func() time.Time { return c.t }
	l.after = func(_ time.Duration, f func()) *time.Timer {
		c.armed++
		c.pending = f
		return time.NewTimer(time.Hour) // stopped by flush; never fires here
	}
	return l, c, &buf
}

func (c *fakeClock) fire() {
	f := c.pending
	c.pending = nil
	if f != nil {
		f()
	}
}

// lines decodes the JSON log lines written so far.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, b := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if len(b) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("log line %q: %v", b, err)
		}
		out = append(out, m)
	}
	return out
}

func TestFirstOccurrenceIsWrittenAtOnce(t *testing.T) {
	l, _, buf := newLimiter(time.Second)
	l.Log("err", "disk full")
	got := lines(t, buf)
	if len(got) != 1 || got[0]["msg"] != "write failed" || got[0]["repeated"] != 1.0 || got[0]["err"] != "disk full" {
		t.Fatalf("lines = %v, want one line with repeated=1 and err", got)
	}
}

func TestBurstBecomesOneSummaryLine(t *testing.T) {
	l, c, buf := newLimiter(time.Second)
	l.Log("n", 0)
	for i := 1; i <= 1500; i++ {
		c.t = c.t.Add(time.Millisecond / 2)
		l.Log("n", i)
	}
	if got := lines(t, buf); len(got) != 1 {
		t.Fatalf("%d lines before the interval ended, want 1", len(got))
	}
	if c.armed != 1 {
		t.Fatalf("%d timers armed for one interval, want 1", c.armed)
	}
	c.t = c.t.Add(time.Second)
	c.fire()
	got := lines(t, buf)
	if len(got) != 2 {
		t.Fatalf("%d lines after the interval, want 2", len(got))
	}
	if got[1]["repeated"] != 1500.0 || got[1]["n"] != 1500.0 {
		t.Fatalf("summary = %v, want repeated=1500 with the latest attributes", got[1])
	}
	if n := l.Count(); n != 1501 {
		t.Fatalf("Count = %d, want 1501", n)
	}
}

func TestQuietIntervalWritesNothing(t *testing.T) {
	l, c, buf := newLimiter(time.Second)
	l.Log()
	c.t = c.t.Add(5 * time.Second)
	c.fire() // nothing was armed: a no-op
	if got := lines(t, buf); len(got) != 1 || c.armed != 0 {
		t.Fatalf("%d lines, %d timers after a single occurrence, want 1 and 0", len(got), c.armed)
	}
	l.Log() // a new interval: written at once
	if got := lines(t, buf); len(got) != 2 || got[1]["repeated"] != 1.0 {
		t.Fatalf("lines = %v, want a second line with repeated=1", got)
	}
}

func TestLateOccurrenceFoldsIntoPendingSummary(t *testing.T) {
	l, c, buf := newLimiter(time.Second)
	l.Log()
	c.t = c.t.Add(time.Millisecond)
	l.Log()
	// The interval ends but the timer has not run yet when the next one
	// comes: it joins the summary rather than being written on its own.
	c.t = c.t.Add(2 * time.Second)
	l.Log("last", true)
	c.fire()
	got := lines(t, buf)
	if len(got) != 2 || got[1]["repeated"] != 2.0 || got[1]["last"] != true {
		t.Fatalf("lines = %v, want the first and one summary of 2", got)
	}
}

func TestDisabledLevelStillCounts(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	l := New(log, slog.LevelWarn, "x", time.Second)
	l.Log()
	if buf.Len() != 0 || l.Count() != 1 {
		t.Fatalf("wrote %q, count %d; want nothing written and a count of 1", buf.String(), l.Count())
	}
}
