package config

import (
	"log/slog"
	"slices"
	"strings"
)

// warning is a setting kvtier accepts but does not act on: an LMCache
// option it ignores, given a value other than LMCache's default, or an
// LMCACHE_ variable that looks like a misspelt LMCache option. Loading
// logs each one once, with log/slog at level WARN.
type warning struct {
	Key    string // the key as written
	Source string // "file.yaml:12" or "env LMCACHE_PY_ENABLE_GC"
	Value  string // the value as read, secrets hidden
	Reason string // why it has no effect
}

func (w warning) String() string {
	var b strings.Builder
	if w.Source != "" {
		b.WriteString(w.Source + ": ")
	}
	b.WriteString("key " + w.Key + ": " + w.Value + " has no effect in kvtier: " + w.Reason)
	return b.String()
}

// warningSet holds at most one warning per key, by canonical key: a later
// source replaces an earlier one, and a later source that puts the key
// back to its default removes it, so each key is reported once and only
// for the value that counts.
type warningSet map[string]warning

// set records w for key, completing it with the key as written and its
// source; a nil w clears the key.
func (ws warningSet) set(canonical string, w *warning, key, source string) {
	if ws == nil {
		return
	}
	if w == nil {
		delete(ws, canonical)
		return
	}
	w.Key, w.Source = key, source
	ws[canonical] = *w
}

// list returns the warnings sorted by key, so logs are stable.
func (ws warningSet) list() []warning {
	if len(ws) == 0 {
		return nil
	}
	keys := make([]string, 0, len(ws))
	for k := range ws {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]warning, len(keys))
	for i, k := range keys {
		out[i] = ws[k]
	}
	return out
}

// logWarnings writes each warning to the default slog logger. Loading
// happens before a daemon builds its own logger, which takes its level from
// this very configuration.
func logWarnings(ws []warning) {
	for _, w := range ws {
		slog.Warn("config: setting has no effect in kvtier",
			"key", w.Key, "source", w.Source, "value", w.Value, "reason", w.Reason)
	}
}
