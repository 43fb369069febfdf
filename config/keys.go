package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// kvtier's own keys come from Config's yaml tags, so the struct is the one
// list of what kvtier understands; the tables below only add LMCache names.

var (
	keyOrder   = orderedKeys()         // keys in struct order
	fieldIndex = indexFields(keyOrder) // key → index of the Config field
)

func indexFields(keys []string) map[string]int {
	m := make(map[string]int, len(keys))
	for i, k := range keys {
		m[k] = i
	}
	return m
}

func orderedKeys() []string {
	t := reflect.TypeFor[Config]()
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i] = tagName(t.Field(i))
	}
	return keys
}

func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

// synonyms maps LMCache key names to the kvtier key that means the same;
// the LMCache table (lmcache.go) says which those are.
var synonyms = lmcacheSynonyms()

// allKeyNames is every name a file may use, sorted so that typo
// suggestions are deterministic.
var allKeyNames = sortedKeyNames()

func sortedKeyNames() []string {
	names := slices.Clone(keyOrder)
	for k := range synonyms {
		names = append(names, k)
	}
	names = append(names, lmcacheNameList...)
	slices.Sort(names)
	return slices.Compact(names)
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	sizeType     = reflect.TypeFor[Size]()
	listType     = reflect.TypeFor[[]string]()
)

// splitList reads a list written on one line: items separated by commas
// or spaces.
func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
}

// decodeField decodes a YAML value into one Config field. It checks kinds
// itself rather than passing yaml.v3's messages on, so every error reads
// "want X, got Y".
func decodeField(dst reflect.Value, n *yaml.Node) error {
	switch dst.Type() {
	case durationType:
		if n.Kind != yaml.ScalarNode {
			return wantError(dst.Type(), n)
		}
		d, err := time.ParseDuration(n.Value)
		if err != nil {
			return fmt.Errorf("want %s: %w", want(dst.Type()), err)
		}
		dst.SetInt(int64(d))
		return nil
	case sizeType:
		var s Size
		if err := s.UnmarshalYAML(n); err != nil {
			return err
		}
		dst.SetInt(int64(s))
		return nil
	case listType:
		return decodeList(dst, n)
	case tenantsType:
		return decodeTenants(dst, n)
	}
	if n.Kind != yaml.ScalarNode && dst.Kind() != reflect.Map {
		return wantError(dst.Type(), n)
	}
	// yaml.v3 would truncate 1.5 into an int; a chunk size is never fractional.
	if dst.Kind() == reflect.Int && n.ShortTag() != "!!int" {
		return wantError(dst.Type(), n)
	}
	v := reflect.New(dst.Type())
	if err := n.Decode(v.Interface()); err != nil {
		return wantError(dst.Type(), n)
	}
	dst.Set(v.Elem())
	return nil
}

// decodeList decodes a YAML list of strings, or one string of items
// separated by commas or spaces.
func decodeList(dst reflect.Value, n *yaml.Node) error {
	var items []string
	switch n.Kind {
	case yaml.ScalarNode:
		items = splitList(n.Value)
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return wantError(dst.Type(), n)
			}
			items = append(items, strings.TrimSpace(c.Value))
		}
	default:
		return wantError(dst.Type(), n)
	}
	dst.Set(reflect.ValueOf(items))
	return nil
}

// parseField parses an environment value into one Config field.
func parseField(dst reflect.Value, s string) error {
	switch dst.Type() {
	case durationType:
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("want %s: %w", want(dst.Type()), err)
		}
		dst.SetInt(int64(d))
		return nil
	case sizeType:
		v, err := ParseSize(s)
		if err != nil {
			return err
		}
		dst.SetInt(int64(v))
		return nil
	case listType:
		dst.Set(reflect.ValueOf(splitList(s)))
		return nil
	case tenantsType:
		return parseTenants(dst, s)
	}
	bad := fmt.Errorf("want %s, got %q", want(dst.Type()), clip(s))
	switch dst.Kind() {
	case reflect.Bool:
		b, err := parseBool(s)
		if err != nil {
			return bad
		}
		dst.SetBool(b)
	case reflect.Int:
		i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 0)
		if err != nil {
			return bad
		}
		dst.SetInt(i)
	case reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return bad
		}
		dst.SetFloat(f)
	case reflect.String:
		dst.SetString(s)
	case reflect.Map:
		// JSON, as LMCache takes it, is also YAML flow syntax.
		m := reflect.New(dst.Type())
		if strings.TrimSpace(s) != "" {
			if err := yaml.Unmarshal([]byte(s), m.Interface()); err != nil {
				return bad
			}
		}
		dst.Set(m.Elem())
	default:
		return fmt.Errorf("internal: no environment parser for %s", dst.Type())
	}
	return nil
}

// parseBool accepts what LMCache's environment parsing accepts.
func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, fmt.Errorf("want true, false, 1 or 0, got %q", clip(s))
}

func want(t reflect.Type) string {
	switch t {
	case durationType:
		return "a duration such as 5ms or 10s"
	case sizeType:
		return `a size such as "512MiB"`
	case listType:
		return "a list of strings"
	case tenantsType:
		return "a list of tenants (name, token or token_file or token_env, namespaces)"
	}
	switch t.Kind() {
	case reflect.Int:
		return "an integer"
	case reflect.Bool:
		return "true or false"
	case reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Map:
		return "a mapping"
	}
	return t.String()
}

func wantError(t reflect.Type, n *yaml.Node) error {
	return fmt.Errorf("want %s, got %s", want(t), describe(n))
}

// describe names a YAML value for an error message.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return strconv.Quote(clip(n.Value))
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

// clip keeps error messages readable when the value is huge.
func clip(s string) string {
	const max = 60
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
