package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Size is a byte count. In a file or a variable it is a plain number of
// bytes or a number with a unit: "512MiB", "4GB", "1.5GiB". KiB, MiB, GiB,
// TiB (and Ki, Mi, Gi, Ti) count in powers of 1024; KB, MB, GB, TB (and K,
// M, G, T) in powers of 1000. Units ignore case.
type Size int64

// Binary and decimal units.
const (
	KiB Size = 1 << (10 * (iota + 1))
	MiB
	GiB
	TiB
)

const (
	KB Size = 1000
	MB      = 1000 * KB
	GB      = 1000 * MB
	TB      = 1000 * GB
)

var sizeUnits = map[string]Size{
	"": 1, "b": 1,
	"k": KB, "kb": KB, "m": MB, "mb": MB, "g": GB, "gb": GB, "t": TB, "tb": TB,
	"ki": KiB, "kib": KiB, "mi": MiB, "mib": MiB, "gi": GiB, "gib": GiB, "ti": TiB, "tib": TiB,
}

// maxSizeText bounds the input so a hostile value cannot make the exact
// arithmetic below expensive.
const maxSizeText = 64

var errSizeSyntax = errors.New(`want a byte count such as 1048576, "512MiB", "4GB" or "1.5GiB"`)

// ParseSize parses a size such as "512MiB". The result must be a whole
// number of bytes that fits in an int64.
func ParseSize(s string) (Size, error) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxSizeText {
		return 0, fmt.Errorf("%w, got %q", errSizeSyntax, s)
	}
	numEnd := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if numEnd < 0 {
		numEnd = len(s)
	}
	number, unitText := s[:numEnd], strings.ToLower(strings.TrimSpace(s[numEnd:]))
	unit, ok := sizeUnits[unitText]
	if !ok {
		return 0, fmt.Errorf("%w: unknown unit %q", errSizeSyntax, s[numEnd:])
	}
	whole, frac, hasDot := strings.Cut(number, ".")
	// Exact arithmetic: bytes = digits × unit / 10^len(frac). Floats would
	// turn "0.1KB" into 100.00000000000001.
	digits, ok := new(big.Int).SetString(whole+frac, 10)
	if !ok || whole == "" || (hasDot && frac == "") {
		return 0, fmt.Errorf("%w, got %q", errSizeSyntax, s)
	}
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	bytes, rem := new(big.Int).QuoRem(digits.Mul(digits, big.NewInt(int64(unit))), scale, new(big.Int))
	if rem.Sign() != 0 {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	if !bytes.IsInt64() {
		return 0, fmt.Errorf("%q is larger than %d bytes", s, int64(math.MaxInt64))
	}
	return Size(bytes.Int64()), nil
}

// String writes the size with the unit that gives the smallest whole
// number, so it reads back exactly: 256MiB, 4GB, 1000.
func (s Size) String() string {
	best, bestUnit := int64(s), ""
	for _, u := range []struct {
		name string
		size Size
	}{{"TiB", TiB}, {"TB", TB}, {"GiB", GiB}, {"GB", GB}, {"MiB", MiB}, {"MB", MB}, {"KiB", KiB}, {"KB", KB}} {
		if s != 0 && s%u.size == 0 && abs(int64(s/u.size)) < abs(best) {
			best, bestUnit = int64(s/u.size), u.name
		}
	}
	return strconv.FormatInt(best, 10) + bestUnit
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// UnmarshalText implements encoding.TextUnmarshaler (environment values).
func (s *Size) UnmarshalText(text []byte) error {
	v, err := ParseSize(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalYAML accepts a YAML number of bytes or a size string.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("%w, got %s", errSizeSyntax, describe(n))
	}
	return s.UnmarshalText([]byte(n.Value))
}

// MarshalYAML writes the size as its String form.
func (s Size) MarshalYAML() (any, error) { return s.String(), nil }
