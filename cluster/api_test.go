package cluster

import (
	"strings"
	"testing"
)

func TestHexKeyRoundTrip(t *testing.T) {
	for _, k := range []uint64{0, 1, 0xdeadbeef, 1<<64 - 1} {
		b := AppendHexKey(nil, k)
		if len(b) != 18 {
			t.Errorf("%x encodes as %s", k, b)
		}
		if got, err := ParseHexKey(b); err != nil || got != k {
			t.Errorf("%s parses as %x, %v", b, got, err)
		}
	}
	if got, err := ParseHexKey([]byte(`"A"`)); err != nil || got != 10 {
		t.Errorf("upper case: %x %v", got, err)
	}
	for _, bad := range []string{``, `""`, `"g"`, `1`, `"12345678901234567"`, `"1`, `null`} {
		if _, err := ParseHexKey([]byte(bad)); err == nil {
			t.Errorf("ParseHexKey(%s) succeeded", bad)
		}
	}
}

func TestResolveChecksTheReply(t *testing.T) {
	r := LookupReply{Daemons: []Daemon{{Instance: "a", Addr: "h:1"}},
		Holders: [][]HolderAt{{{Daemon: 0, Tier: "cpu"}}, nil}}
	hs, err := r.Resolve(2)
	if err != nil || len(hs) != 2 || hs[0][0] != (Holder{Instance: "a", Addr: "h:1", Tier: "cpu"}) || hs[1] != nil {
		t.Fatalf("Resolve = %+v, %v", hs, err)
	}
	if _, err := r.Resolve(3); err == nil {
		t.Error("a reply for 2 keys resolved for 3")
	}
	r.Holders[0][0].Daemon = 1
	if _, err := r.Resolve(2); err == nil || !strings.Contains(err.Error(), "daemon 1") {
		t.Errorf("a holder naming an unlisted daemon: %v", err)
	}
}

func TestValidateInstanceNames(t *testing.T) {
	ok := Register{Instance: "node-1:7482", Addr: "h:1", Events: "tcp://h:2", Admin: "http://h:3"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "a b", "a@b", "é", strings.Repeat("a", 129)} {
		r := ok
		r.Instance = name
		if err := r.Validate(); err == nil {
			t.Errorf("instance %q accepted", name)
		}
	}
}

func FuzzParseHexKey(f *testing.F) {
	f.Add([]byte(`"0123456789abcdef"`))
	f.Add([]byte(`"x"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseHexKey(b)
		if err != nil {
			return
		}
		if again, err := ParseHexKey(AppendHexKey(nil, k)); err != nil || again != k {
			t.Fatalf("%x does not round-trip", k)
		}
	})
}
