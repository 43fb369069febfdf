package admin

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeClear feeds arbitrary bodies to the clear decoder: it must
// never panic, and what it accepts must survive a round trip.
func FuzzDecodeClear(f *testing.F) {
	for _, s := range []string{"", " ", `{"scope": 1}`, `{"scope": "0xff"}`, `{"scope": "18446744073709551615"}`,
		`{"scope": -1}`, `{"scope": 1e3}`, `{"scope": null}`, `{}`, `{"scope": 1} x`, `[]`, `"\u0000"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeClear(body)
		if err != nil {
			return
		}
		again, err := decodeClear(mustJSON(t, map[string]uint64{"scope": uint64(req.Scope)}))
		if err != nil || again != req {
			t.Fatalf("%q decoded to %+v, which re-decodes to %+v (%v)", body, req, again, err)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
