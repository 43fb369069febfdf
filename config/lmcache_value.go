package config

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Values of LMCache keys kvtier does not implement are decoded only to be
// type-checked and compared with LMCache's default. They are read the way
// LMCache's converters read them: a list may also be one number or a
// comma-separated string, and any scalar is a string.

func (k valueKind) want() string {
	switch k {
	case kindBool:
		return "true or false"
	case kindInt:
		return "an integer"
	case kindFloat:
		return "a number"
	case kindString:
		return "a string"
	case kindInts:
		return "a list of integers"
	case kindFloats:
		return "a list of numbers"
	case kindStrings:
		return "a list of strings"
	case kindMap:
		return "a mapping"
	}
	return "a value"
}

func (k valueKind) wrong(n *yaml.Node) error {
	return fmt.Errorf("want %s, got %s", k.want(), describe(n))
}

// decode reads a YAML value as kind k; null is nil.
func (k valueKind) decode(n *yaml.Node) (any, error) {
	n = resolveAlias(n)
	if isNull(n) {
		return nil, nil
	}
	switch k {
	case kindInts, kindFloats, kindStrings:
		return k.decodeList(n)
	case kindMap:
		if n.Kind != yaml.MappingNode {
			return nil, k.wrong(n)
		}
		var m map[string]any
		if err := n.Decode(&m); err != nil {
			return nil, k.wrong(n)
		}
		return m, nil
	}
	if n.Kind != yaml.ScalarNode {
		return nil, k.wrong(n)
	}
	return k.decodeScalar(n)
}

func (k valueKind) decodeScalar(n *yaml.Node) (any, error) {
	tag := n.ShortTag()
	switch k {
	case kindBool:
		var b bool
		if n.Decode(&b) != nil {
			return nil, k.wrong(n)
		}
		return b, nil
	case kindInt:
		var i int64
		if tag != "!!int" || n.Decode(&i) != nil {
			return nil, k.wrong(n)
		}
		return i, nil
	case kindFloat:
		var f float64
		if (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil {
			return nil, k.wrong(n)
		}
		return f, nil
	}
	return n.Value, nil // kindString: LMCache's str() takes any scalar
}

// decodeList reads a YAML list, or a scalar as LMCache's list converters
// read it: one number, or items separated by commas.
func (k valueKind) decodeList(n *yaml.Node) (any, error) {
	item := k.item()
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		return k.parse(n.Value)
	case n.Kind == yaml.ScalarNode:
		v, err := item.decodeScalar(n)
		if err != nil {
			return nil, k.wrong(n)
		}
		return appendItem(k.emptyList(), v), nil
	case n.Kind != yaml.SequenceNode:
		return nil, k.wrong(n)
	}
	list := k.emptyList()
	for _, c := range n.Content {
		c = resolveAlias(c)
		if c.Kind != yaml.ScalarNode || isNull(c) {
			return nil, k.wrong(n)
		}
		v, err := item.decodeScalar(c)
		if err != nil {
			return nil, fmt.Errorf("want %s: %w", k.want(), err)
		}
		list = appendItem(list, v)
	}
	return list, nil
}

// item is the kind of one element of a list kind.
func (k valueKind) item() valueKind {
	switch k {
	case kindInts:
		return kindInt
	case kindFloats:
		return kindFloat
	}
	return kindString
}

func (k valueKind) emptyList() any {
	switch k {
	case kindInts:
		return []int64{}
	case kindFloats:
		return []float64{}
	}
	return []string{}
}

func appendItem(list, v any) any {
	switch l := list.(type) {
	case []int64:
		return append(l, v.(int64))
	case []float64:
		return append(l, v.(float64))
	case []string:
		return append(l, v.(string))
	}
	return list
}

// parse reads an environment value as kind k. An empty value is unset.
func (k valueKind) parse(s string) (any, error) {
	t := strings.TrimSpace(s)
	bad := fmt.Errorf("want %s, got %q", k.want(), clip(s))
	switch k {
	case kindBool:
		b, err := parseBool(s)
		if err != nil {
			return nil, bad
		}
		return b, nil
	case kindInt, kindFloat:
		if t == "" {
			return nil, nil
		}
		v, err := parseNumber(k, t)
		if err != nil {
			return nil, bad
		}
		return v, nil
	case kindString:
		return s, nil
	case kindMap:
		var m map[string]any
		if t != "" && yaml.Unmarshal([]byte(s), &m) != nil {
			return nil, bad
		}
		return m, nil
	}
	return k.parseList(s, bad)
}

func parseNumber(k valueKind, s string) (any, error) {
	if k == kindInt {
		return strconv.ParseInt(s, 10, 64)
	}
	return strconv.ParseFloat(s, 64)
}

// parseList splits on commas, as LMCache's list converters do.
func (k valueKind) parseList(s string, bad error) (any, error) {
	list := k.emptyList()
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if k == kindStrings {
			list = appendItem(list, part)
			continue
		}
		v, err := parseNumber(k.item(), part)
		if err != nil {
			return nil, bad
		}
		list = appendItem(list, v)
	}
	return list, nil
}

// unquote strips one pair of matching quotes around an LMCACHE_ value, as
// LMCache does before converting it, so LMCACHE_REMOTE_SERDE='"naive"'
// means naive there and here.
func unquote(s string) string {
	t := strings.TrimSpace(s)
	if len(t) >= 2 && t[0] == t[len(t)-1] && (t[0] == '"' || t[0] == '\'') {
		return t[1 : len(t)-1]
	}
	return s
}
