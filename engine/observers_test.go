package engine_test

import (
	"testing"

	"kvtier/chunk"
	"kvtier/engine"
)

type countingObserver struct{ admitted, dropped int }

func (c *countingObserver) Admitted(string, chunk.Key) { c.admitted++ }
func (c *countingObserver) Dropped(string, chunk.Key)  { c.dropped++ }

// TestObserversReportToEach checks every listener hears every event and
// nil entries are skipped.
func TestObserversReportToEach(t *testing.T) {
	a, b := &countingObserver{}, &countingObserver{}
	o := engine.Observers(a, nil, b)
	o.Admitted("mem", chunk.Key{})
	o.Dropped("mem", chunk.Key{})
	o.Admitted("disk", chunk.Key{})
	for _, c := range []*countingObserver{a, b} {
		if c.admitted != 2 || c.dropped != 1 {
			t.Errorf("observer heard %d admissions and %d drops, want 2 and 1", c.admitted, c.dropped)
		}
	}
}
