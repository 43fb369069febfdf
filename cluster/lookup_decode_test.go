package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestDecodeLookupForms(t *testing.T) {
	var req LookupRequest
	body := ` { "keys" : [ "0123456789abcdef" , "1" ] } `
	if err := DecodeLookup([]byte(body), &req); err != nil || !slices.Equal(req.Keys, []HexKey{0x0123456789abcdef, 1}) || req.Scope != nil {
		t.Fatalf("keys form: %+v, %v", req, err)
	}
	body = `{"scope":{"model":"m \"q\" {}","world_size":2,"rank":1,"format":"f","namespace":"n"},"tokens":[0,7,4294967295]}`
	if err := DecodeLookup([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	want := Scope{Model: `m "q" {}`, WorldSize: 2, Rank: 1, Format: "f", Namespace: "n"}
	if req.Scope == nil || *req.Scope != want || !slices.Equal(req.Tokens, []uint32{0, 7, 1<<32 - 1}) || len(req.Keys) != 0 {
		t.Fatalf("tokens form: %+v %+v", req, req.Scope)
	}
	// The slices are reused, and cleared, by the next decode.
	if err := DecodeLookup([]byte(`{"keys":null,"tokens":[]}`), &req); err != nil || len(req.Keys)+len(req.Tokens) != 0 || req.Scope != nil {
		t.Fatalf("nulls: %+v, %v", req, err)
	}
}

// TestDecodeLookupTokenLengths runs numbers of every length through the
// eight-byte path and the byte-by-byte one, with and without spaces.
func TestDecodeLookupTokenLengths(t *testing.T) {
	var want []uint32
	for v := uint64(1); v < 1<<32; v = v*10 + v%7 {
		want = append(want, uint32(v), 0, uint32(v/10*10))
	}
	want = append(want, 1<<32-1)
	for _, sep := range []string{",", " , ", ",\n"} {
		var b strings.Builder
		b.WriteString(`{"scope":{},"tokens":[`)
		for i, v := range want {
			if i > 0 {
				b.WriteString(sep)
			}
			b.WriteString(strconv.FormatUint(uint64(v), 10))
		}
		b.WriteString(`]}`)
		var req LookupRequest
		if err := DecodeLookup([]byte(b.String()), &req); err != nil || !slices.Equal(req.Tokens, want) {
			t.Fatalf("sep %q: %v\ngot  %v\nwant %v", sep, err, req.Tokens, want)
		}
	}
}

func TestDecodeLookupRejects(t *testing.T) {
	for body, want := range map[string]string{
		``:                                   "want '{'",
		`[]`:                                 "want '{'",
		`{"keys":["1"]} {}`:                  "data after",
		`{"keys":["1"],}`:                    "want '\"'",
		`{"Keys":["1"]}`:                     "unknown field",
		`{"k\\u0065ys":["1"]}`:               "escapes",
		`{"keys":["1"],"keys":["2"]}`:        "twice",
		`{"keys":"1"}`:                       "want an array",
		`{"keys":[1]}`:                       "want strings",
		`{"keys":["1"`:                       "want ',' or ']'",
		`{"keys":["12345678901234567"]}`:     "1 to 16",
		`{"tokens":[-1]}`:                    "token ids",
		`{"tokens":[01]}`:                    "leading zero",
		`{"tokens":[1.5]}`:                   "fraction",
		`{"tokens":[1e3]}`:                   "fraction",
		`{"tokens":[4294967296]}`:            "more than 4294967295",
		`{"tokens":[99999999999999]}`:        "more than 4294967295",
		`{"tokens":["1"]}`:                   "token ids",
		`{"scope":[]}`:                       "want an object",
		`{"scope":{"model":1}}`:              "scope",
		`{"scope":{"colour":"red"}}`:         "unknown field",
		`{"scope":{"model":"x}`:              "unterminated",
		`{"scope":{"a":[[[[[[[[[]]]]]]]]]}}`: "too deep",
	} {
		var req LookupRequest
		err := DecodeLookup([]byte(body), &req)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", body, err, want)
		}
	}
}

func TestDecodeLookupBounds(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"keys":[`)
	for i := range MaxLookupKeys + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"1"`)
	}
	b.WriteString(`]}`)
	var req LookupRequest
	if err := DecodeLookup([]byte(b.String()), &req); !errors.Is(err, ErrTooLarge) {
		t.Errorf("%d keys: %v, want ErrTooLarge", MaxLookupKeys+1, err)
	}
}

func TestLookupRequestCheck(t *testing.T) {
	s := &Scope{Model: "m"}
	for _, tc := range []struct {
		req LookupRequest
		ok  bool
	}{
		{LookupRequest{Keys: []HexKey{1}}, true},
		{LookupRequest{Scope: s, Tokens: []uint32{1}}, true},
		{LookupRequest{Scope: s}, true},
		{LookupRequest{}, true},
		{LookupRequest{Keys: []HexKey{1}, Scope: s}, false},
		{LookupRequest{Keys: []HexKey{1}, Tokens: []uint32{1}}, false},
		{LookupRequest{Tokens: []uint32{1}}, false},
		{LookupRequest{Scope: &Scope{Rank: -1}}, false},
	} {
		if err := tc.req.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v: Check = %v", tc.req, err)
		}
	}
}

// BenchmarkDecodeLookupTokens decodes a 32k-token prompt of 6-digit ids.
func BenchmarkDecodeLookupTokens(b *testing.B) {
	body := []byte(`{"scope":{"model":"m","world_size":1},"tokens":[`)
	for i := range 32768 {
		if i > 0 {
			body = append(body, ',')
		}
		body = strconv.AppendUint(body, uint64(100000+i*7919%28000), 10)
	}
	body = append(body, "]}"...)
	var req LookupRequest
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for range b.N {
		if err := DecodeLookup(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeLookup checks the decoder against encoding/json: whatever it
// accepts, encoding/json (strict) accepts with the same values; it never
// panics.
func FuzzDecodeLookup(f *testing.F) {
	f.Add([]byte(`{"keys":["0123456789abcdef","1"]}`))
	f.Add([]byte(`{"scope":{"model":"m","world_size":1,"rank":0,"format":"f","namespace":""},"tokens":[1,2,3]}`))
	f.Add([]byte(`{"tokens":[0,4294967295],"scope":null}`))
	f.Add([]byte(`{"scope":{"model":"a\"}"},"tokens":[]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"tokens":[1,12,123,1234,12345,123456,1234567,12345678,0,10,100,00,01,1.0,1e2,-1]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var got LookupRequest
		if err := DecodeLookup(body, &got); err != nil {
			return
		}
		var want LookupRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("DecodeLookup accepted %q, encoding/json did not: %v", body, err)
		}
		if dec.More() {
			t.Fatalf("DecodeLookup accepted trailing data in %q", body)
		}
		if !slices.Equal(got.Keys, want.Keys) || !slices.Equal(got.Tokens, want.Tokens) ||
			(got.Scope == nil) != (want.Scope == nil) || got.Scope != nil && *got.Scope != *want.Scope {
			t.Fatalf("%q: DecodeLookup %+v, encoding/json %+v", body, got, want)
		}
	})
}
