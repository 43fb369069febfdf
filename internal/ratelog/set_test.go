package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestSetLimitsEachMessage logs two messages a thousand times each within
// one interval: each is written once, at once, and the rest are counted.
func TestSetLimitsEachMessage(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var s Set
	for i := range 1000 {
		s.Log(log, slog.LevelWarn, "heartbeat failed", "i", i)
		s.Log(log, slog.LevelInfo, "closing connection", "i", i)
	}
	out := buf.String()
	if n := strings.Count(out, "heartbeat failed"); n != 1 {
		t.Errorf("heartbeat failed written %d times:\n%s", n, out)
	}
	if n := strings.Count(out, "closing connection"); n != 1 {
		t.Errorf("closing connection written %d times:\n%s", n, out)
	}
	if !strings.Contains(out, "level=WARN msg=\"heartbeat failed\" repeated=1 i=0") {
		t.Errorf("the first occurrence is not written as it came:\n%s", out)
	}
	if got := s.limiter(log, slog.LevelWarn, "heartbeat failed").Count(); got != 1000 {
		t.Errorf("counted %d occurrences, want 1000", got)
	}
	s.Log(nil, slog.LevelWarn, "no logger") // no panic, nothing written
}
