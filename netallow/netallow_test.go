package netallow

import "testing"

func TestAllowed(t *testing.T) {
	l, err := Parse([]string{"10.0.0.2:7482", "decode-1.example", "192.168.4.0/24", "[fd00::1]:7482", "fd00::2", "[fd00::3]", " Decode-2.Example. "})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dest string
		ok   bool
	}{
		{"10.0.0.2:7482", true},
		{"10.0.0.2:7483", false}, // another port
		{"10.0.0.3:7482", false},
		{"[::ffff:10.0.0.2]:7482", true}, // the same address, mapped
		{"decode-1.example:1", true},
		{"DECODE-1.example.:1", true},
		{"decode-2.example:9", true},
		{"decode-3.example:1", false},
		{"192.168.4.77:7482", true},
		{"192.168.5.1:7482", false},
		{"[fd00::1]:7482", true},
		{"[fd00::1]:1", false},
		{"[fd00::2]:1", true},
		{"[fd00::3]:1", true},
		{"127.0.0.1:7482", false}, // loopback is not implied once a list is given
		{"nohost", false},
		{"", false},
	} {
		if err := l.Allowed(c.dest); (err == nil) != c.ok {
			t.Errorf("Allowed(%q) = %v, want allowed %v", c.dest, err, c.ok)
		}
	}
}

// TestDefaultIsLoopback: with no entries only loopback IP addresses are
// allowed; a name is not resolved, so not even localhost is.
func TestDefaultIsLoopback(t *testing.T) {
	for _, l := range []*List{nil, {}} {
		for dest, ok := range map[string]bool{
			"127.0.0.1:7482": true, "127.8.9.10:1": true, "[::1]:7482": true,
			"localhost:7482": false, "10.0.0.2:7482": false, "0.0.0.0:7482": false, "[::]:1": false,
		} {
			if err := l.Allowed(dest); (err == nil) != ok {
				t.Errorf("default Allowed(%q) = %v, want allowed %v", dest, err, ok)
			}
		}
	}
}

func TestParseRefusesMalformedEntries(t *testing.T) {
	for _, s := range []string{"", " ", "10.0.0.0/33", "host:", ":7482", "[fd00::1", "a/b"} {
		if _, err := Parse([]string{s}); err == nil {
			t.Errorf("Parse(%q) accepted it", s)
		}
	}
}

func FuzzAllowed(f *testing.F) {
	f.Add("10.0.0.0/8", "10.1.2.3:4")
	f.Add("[fd00::1]:7482", "[fd00::1]:7482")
	f.Add("name", "name:1")
	f.Fuzz(func(t *testing.T, entry, dest string) {
		l, err := Parse([]string{entry})
		if err != nil {
			return
		}
		l.Allowed(dest) // must not panic
	})
}
