// Package ratelog keeps an error that repeats from flooding the log.
//
// A path that fails on every request (a full disk, a store that is down)
// would otherwise log one line per request: thousands a second, which bury
// everything else and cost real CPU. A Limiter logs the first occurrence at
// once and then at most one line per interval, carrying how many
// occurrences that line stands for and the attributes of the latest one, so
// no occurrence goes uncounted and the log still shows that the error goes
// on. Total counts belong in metrics: Count gives one.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter logs one message, at one level, at most once per interval.
// It is safe for concurrent use. The zero value is not usable: call New.
type Limiter struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	every time.Duration

	// now and after are time.Now and time.AfterFunc; tests replace them.
	now   func() time.Time
	after func(time.Duration, func()) *time.Timer

	mu      sync.Mutex
	last    time.Time // when the last line was written
	pending uint64    // occurrences since then, not yet in any line
	args    []any     // attributes of the latest pending occurrence
	timer   *time.Timer
	count   uint64 // occurrences since New
}

// New returns a limiter that writes msg to log at level at most once per
// every (one second when every is not positive).
func New(log *slog.Logger, level slog.Level, msg string, every time.Duration) *Limiter {
	if every <= 0 {
		every = time.Second
	}
	return &Limiter{log: log, level: level, msg: msg, every: every, now: time.Now, after: time.AfterFunc}
}

// Log records one occurrence with its attributes (slog key-value pairs).
// The first occurrence in an interval is written at once; later ones are
// counted, and a line for them follows when the interval ends, with
// "repeated" set to how many occurred and the latest one's attributes.
func (l *Limiter) Log(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	now := l.now()
	if l.last.IsZero() || now.Sub(l.last) >= l.every {
		if l.pending > 0 { // the summary's timer has not run yet: fold it in
			l.pending++
			l.args = args
			l.flushLocked(now)
			return
		}
		l.last = now
		l.write(1, args)
		return
	}
	l.pending++
	l.args = args
	if l.timer == nil {
		l.timer = l.after(l.every-now.Sub(l.last), l.flush)
	}
}

// Count returns how many occurrences were recorded since New, written or
// not.
func (l *Limiter) Count() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// flush writes the line for the occurrences counted since the last one.
func (l *Limiter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked(l.now())
}

func (l *Limiter) flushLocked(now time.Time) {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if l.pending == 0 {
		return
	}
	l.write(l.pending, l.args)
	l.last = now
	l.pending, l.args = 0, nil
}

// write emits one line standing for n occurrences: "repeated" is 1 for an
// occurrence written at once, and the count a held-back line sums up.
func (l *Limiter) write(n uint64, args []any) {
	if !l.log.Enabled(context.Background(), l.level) {
		return
	}
	attrs := make([]any, 0, len(args)+2)
	attrs = append(attrs, "repeated", n)
	attrs = append(attrs, args...)
	l.log.Log(context.Background(), l.level, l.msg, attrs...)
}
