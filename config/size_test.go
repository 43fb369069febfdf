package config

import (
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	good := map[string]Size{
		"0":           0,
		"4096":        4096,
		"512MiB":      512 << 20,
		"512mib":      512 << 20,
		"512 MiB":     512 << 20,
		"512Mi":       512 << 20,
		"4GB":         4_000_000_000,
		"4gb":         4_000_000_000,
		"4G":          4_000_000_000,
		"1.5GiB":      3 << 29,
		"0.5KiB":      512,
		"0.1KB":       100, // exact: no float rounding
		"1TiB":        1 << 40,
		"2TB":         2_000_000_000_000,
		" 7B ":        7,
		"8388607TiB":  8388607 << 40,
		"007k":        7000,
		"1.000000KiB": 1024,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("%q: got %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                      "want a byte count",
		"MiB":                   "want a byte count",
		"-1MiB":                 "want a byte count",
		"1.":                    "want a byte count",
		".5GiB":                 "want a byte count",
		"1..5GiB":               "want a byte count",
		"1.5.5":                 "want a byte count",
		"8EiB":                  "unknown unit",
		"1e9":                   "unknown unit",
		"0x10":                  "unknown unit",
		"10 parsecs":            "unknown unit",
		"1.1B":                  "not a whole number of bytes",
		"0.3KiB":                "not a whole number of bytes",
		"8388608TiB":            "larger than",
		"99999999999999999999":  "larger than",
		strings.Repeat("9", 65): "want a byte count",
	}
	for in, want := range bad {
		if got, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %d, %v; want an error saying %q", in, got, err, want)
		}
	}
}

func TestSizeString(t *testing.T) {
	cases := map[Size]string{
		0:                 "0",
		1000:              "1KB",
		1024:              "1KiB",
		1536:              "1536",
		256 * MiB:         "256MiB",
		4 * GB:            "4GB",
		3 * GiB / 2:       "1536MiB",
		TiB:               "1TiB",
		math.MaxInt64:     "9223372036854775807",
		1_000_000_000_001: "1000000000001",
	}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("%d: got %q, want %q", int64(s), got, want)
		}
		if back, err := ParseSize(s.String()); err != nil || back != s {
			t.Errorf("%d does not read back: %d, %v", int64(s), back, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "4GB", "1.5GiB", "0.1KB", "", "1e9", "8388608TiB", "1.", " 3 k "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			return
		}
		if v < 0 {
			t.Fatalf("%q parsed to negative %d", s, v)
		}
		back, err := ParseSize(v.String())
		if err != nil || back != v {
			t.Fatalf("%q → %d → %q → %d, %v", s, v, v.String(), back, err)
		}
	})
}
