package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestReadTrace(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 27, "input_length": 512, "output_length": 0, "hash_ids": [0], "extra": "ignored"}
  {"timestamp": 30, "input_length": 0, "output_length": 1, "hash_ids": []}  
`
	got, err := ReadTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Timestamp: 0, InputLength: 1000, OutputLength: 5, HashIDs: []uint64{0, 1}},
		{Timestamp: 27, InputLength: 512, OutputLength: 0, HashIDs: []uint64{0}},
		{Timestamp: 30, InputLength: 0, OutputLength: 1, HashIDs: []uint64{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if got[0].BlockLen(0) != 512 || got[0].BlockLen(1) != 488 {
		t.Errorf("block lengths %d, %d; want 512, 488", got[0].BlockLen(0), got[0].BlockLen(1))
	}
}

func TestReadTraceErrors(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [7]}` + "\n"
	for _, tc := range []struct{ name, line, want string }{
		{"syntax", `{"timestamp": 0, "input_length": 10,`, "line 3"},
		{"not an object", `[1, 2]`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"wrong type", `{"input_length": "ten", "hash_ids": [1]}`, "input_length"},
		{"negative id", `{"input_length": 10, "hash_ids": [-1]}`, "line 3"},
		{"trailing data", `{"input_length": 10, "hash_ids": [1]} {}`, "line 3"},
		{"negative length", `{"input_length": -1, "hash_ids": []}`, "negative length"},
		{"too few ids", `{"input_length": 1025, "hash_ids": [1, 2]}`, "2 hash_ids for input_length 1025, want 3"},
		{"too many ids", `{"input_length": 512, "hash_ids": [1, 2]}`, "want 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(good + "\n" + tc.line + "\n" + good))
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name line 3 and %q", err, tc.want)
			}
		})
	}
}

func TestReadTraceLineTooLong(t *testing.T) {
	long := `{"input_length": 0, "hash_ids": [], "pad": "` + strings.Repeat("x", maxLine) + `"}`
	_, err := ReadTrace(strings.NewReader("\n" + long))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("error %v, want one naming line 2", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReadTraceReadError(t *testing.T) {
	if _, err := ReadTrace(failingReader{}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("error %v does not carry the reader's", err)
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}` + "\n"))
	f.Add([]byte("{\"input_length\": 1, \"hash_ids\": [18446744073709551615]}\n\n{}\n"))
	f.Add([]byte(`{"input_length": 1e3, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadTrace(bytes.NewReader(data))
		if err != nil {
			return
		}
		// What parses is valid and survives a round trip.
		var buf bytes.Buffer
		for i := range reqs {
			if err := reqs[i].validate(); err != nil {
				t.Fatalf("request %d accepted but invalid: %v", i, err)
			}
			line, err := json.Marshal(reqs[i])
			if err != nil {
				t.Fatal(err)
			}
			buf.Write(line)
			buf.WriteByte('\n')
		}
		again, err := ReadTrace(&buf)
		if err != nil {
			t.Fatalf("re-encoded trace does not parse: %v", err)
		}
		if len(again) != len(reqs) || len(reqs) > 0 && !reflect.DeepEqual(again, reqs) {
			t.Fatalf("round trip changed the trace:\n%+v\n%+v", reqs, again)
		}
	})
}
