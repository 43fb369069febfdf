package cluster

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

const testKey = "00000000000000ab/000102030405060708090a0b0c0d0e0f"

func TestChunkKeyRoundTrip(t *testing.T) {
	k, err := ParseChunkKey(testKey)
	if err != nil {
		t.Fatal(err)
	}
	if k.Scope != 0xab || k.Hash[15] != 0x0f || k.String() != testKey {
		t.Fatalf("parsed %+v, prints %s", k, k)
	}
	for _, bad := range []string{"", "ab", "ab/", "/000102030405060708090a0b0c0d0e0f", "xx/000102030405060708090a0b0c0d0e0f",
		"00000000000000000ab/000102030405060708090a0b0c0d0e0f", "ab/000102030405060708090a0b0c0d0e", "ab/000102030405060708090a0b0c0d0e0g"} {
		if _, err := ParseChunkKey(bad); err == nil {
			t.Errorf("ParseChunkKey(%q) accepted", bad)
		}
	}
}

func TestOpRequestValidate(t *testing.T) {
	key := `"` + testKey + `"`
	for _, c := range []struct {
		body, err string // err "" means valid
	}{
		{`{"kind":"clear","all":true}`, ""},
		{`{"kind":"clear","instances":["d1"],"tier":"cpu","scope":"ab"}`, ""},
		{`{"kind":"clear","all":true,"scope":"ab","model":"m"}`, "give one"},
		{`{"kind":"clear","all":true,"keys":[` + key + `]}`, "not keys"},
		{`{"kind":"clear"}`, "instances or all"},
		{`{"kind":"clear","all":true,"instances":["d1"]}`, "instances or all"},
		{`{"kind":"clear","instances":["d1","d1"]}`, "twice"},
		{`{"kind":"clear","instances":["a b"]}`, "printable"},
		{`{"kind":"pin","all":true,"keys":[` + key + `],"ttl_ms":1000}`, ""},
		{`{"kind":"pin","all":true,"keys":[` + key + `]}`, "ttl_ms: required"},
		{`{"kind":"pin","all":true,"ttl_ms":5}`, "keys: required"},
		{`{"kind":"unpin","all":true,"keys":[` + key + `],"ttl_ms":5}`, "only for pin"},
		{`{"kind":"unpin","all":true,"keys":[` + key + `],"tier":"mem"}`, "only for clear"},
		{`{"kind":"copy","instances":["d1"],"to":"d2","keys":[` + key + `]}`, ""},
		{`{"kind":"move","all":true,"to_tier":"disk","keys":[` + key + `]}`, ""},
		{`{"kind":"move","all":true,"keys":[` + key + `]}`, "destination"},
		{`{"kind":"copy","all":true,"to":"d2","keys":[` + key + `]}`, "exactly one source"},
		{`{"kind":"copy","instances":["d2"],"to":"d2","keys":[` + key + `]}`, "is the source"},
		{`{"kind":"pin","all":true,"to":"d2","keys":[` + key + `],"ttl_ms":1}`, "only for copy"},
		{`{"kind":"clear","all":true,"timeout_ms":600001}`, "timeout_ms"},
		{`{"kind":"nuke","all":true}`, "kind"},
	} {
		var r OpRequest
		err := Decode(strings.NewReader(c.body), MaxOpBodyBytes, &r)
		if err == nil {
			err = r.Validate()
		}
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one saying %q", c.body, err, c.err)
		}
	}
}

func TestOpRequestTierAlias(t *testing.T) {
	r := OpRequest{Kind: OpClear, All: true, Tier: "cpu"}
	if err := r.Validate(); err != nil || r.Tier != "mem" {
		t.Fatalf("tier cpu: %v, normalized to %q", err, r.Tier)
	}
}

// FuzzDecodeOpRequest feeds arbitrary bodies to the operation request's
// decoder and validation: never a panic, and a request they accept
// survives a round trip through JSON unchanged.
func FuzzDecodeOpRequest(f *testing.F) {
	for _, s := range []string{`{"kind":"clear","all":true}`, `{"kind":"pin","instances":["d1"],"keys":["ab/000102030405060708090a0b0c0d0e0f"],"ttl_ms":9}`,
		`{"kind":"copy","instances":["d1"],"to":"d2","to_tier":"disk","keys":["1/000102030405060708090a0b0c0d0e0f"],"timeout_ms":5}`,
		`{"kind":"clear","all":true,"scope":"ffffffffffffffff","tier":"cpu"}`, `{"kind":"clear","all":true} {}`, `{"keys":[1]}`, `[]`, ``,
		`{"kind":"clear","all":true,"instances":[],"keys":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r OpRequest
		if err := Decode(bytes.NewReader(body), MaxOpBodyBytes, &r); err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			return
		}
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var again OpRequest
		if err := Decode(bytes.NewReader(data), MaxOpBodyBytes, &again); err != nil {
			t.Fatalf("%s re-encoded as %s, which does not decode: %v", body, data, err)
		}
		if err := again.Validate(); err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("%s → %+v → %s → %+v (%v)", body, r, data, again, err)
		}
	})
}

// FuzzParseChunkKey: never a panic, and what parses prints back to a
// string that parses to the same key.
func FuzzParseChunkKey(f *testing.F) {
	for _, s := range []string{testKey, "1/00000000000000000000000000000000", "/", "ab/cd", "ffffffffffffffff/ffffffffffffffffffffffffffffffff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseChunkKey(s)
		if err != nil {
			return
		}
		again, err := ParseChunkKey(k.String())
		if err != nil || again != k {
			t.Fatalf("%q → %v → %v (%v)", s, k, again, err)
		}
	})
}

// FuzzDecodeDaemonBodies feeds arbitrary bodies to the decoders of the
// daemon-side requests and the reply: an error or a value, never a panic.
func FuzzDecodeDaemonBodies(f *testing.F) {
	for _, s := range []string{`{"tier":"disk","scope":"ab"}`, `{"keys":["ab/000102030405060708090a0b0c0d0e0f"],"ttl_ms":5}`,
		`{"from":"127.0.0.1:1","keys":[],"tier":"mem"}`, `{"keys":["ab/00"],"tier":"disk","move":true}`,
		`{"counts":{"pulled":1},"keys":["1/000102030405060708090a0b0c0d0e0f"]}`, `{"scope":1}`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&DaemonClear{}, &DaemonPin{}, &DaemonKeys{}, &DaemonCopy{}, &DaemonPull{}, &DaemonReply{}} {
			if Decode(bytes.NewReader(body), MaxOpBodyBytes, v) != nil {
				continue
			}
			if _, err := json.Marshal(v); err != nil {
				t.Fatalf("%s decoded into %T, which does not encode: %v", body, v, err)
			}
		}
	})
}
