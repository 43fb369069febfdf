package redisindex

import "time"

// SetClock replaces the clock that stamps holdings, for expiry tests.
func SetClock(ix *Index, now func() time.Time) { ix.now = now }
