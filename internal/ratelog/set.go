package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Every is the least time between two lines of one message that a Set
// writes: long enough that an error repeating per request costs a line
// every few seconds, short enough that a live problem stays visible.
const Every = 10 * time.Second

// Set rate-limits several messages of one component, each on its own
// Limiter made on first use: one field in the component's struct instead
// of one per message. The zero value is ready to use; a Set must not be
// copied after first use.
type Set struct {
	mu sync.Mutex
	m  map[string]*Limiter
}

// Log records an occurrence of msg at level, written to log at most once
// per Every with the count of occurrences it stands for (see Limiter.Log).
// The logger of the first occurrence of msg is the one its lines go to.
func (s *Set) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if log == nil {
		return
	}
	s.limiter(log, level, msg).Log(args...)
}

func (s *Set) limiter(log *slog.Logger, level slog.Level, msg string) *Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.m[msg]
	if !ok {
		if s.m == nil {
			s.m = make(map[string]*Limiter)
		}
		l = New(log, level, msg, Every)
		s.m[msg] = l
	}
	return l
}
