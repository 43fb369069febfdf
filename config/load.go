package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Environment variables. Every other KVTIER_ variable must name a key.
const (
	envPrefix            = "KVTIER_"
	envConfigFile        = "KVTIER_CONFIG_FILE"
	envLMCacheConfigFile = "LMCACHE_CONFIG_FILE"
)

// origins records where each key's final value came from, so that a
// validation error can point at the file line or variable to fix.
type origins map[string]string

// Load reads the YAML file at path — or, when path is "", the file named by
// KVTIER_CONFIG_FILE or else LMCACHE_CONFIG_FILE, if either is set — applies
// the KVTIER_* environment overrides and validates the result.
func Load(path string) (Config, error) {
	return load(path, os.Environ(), os.Geteuid())
}

// FromEnv is Load("") with environ (KEY=value entries, as os.Environ
// returns) in place of the process environment.
func FromEnv(environ []string) (Config, error) {
	return load("", environ, os.Geteuid())
}

// Parse decodes a YAML document over the defaults and validates it, without
// looking at the environment. name labels positions in errors.
func Parse(data []byte, name string) (Config, error) {
	c := Default()
	from := origins{}
	if err := decodeFile(&c, data, name, from); err != nil {
		return Config{}, err
	}
	return finish(c, from)
}

// UnmarshalYAML decodes with the same strictness as Parse, so a Config
// embedded in a larger document is checked too. It does not validate.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	return decodeNode(c, n, "", nil)
}

func load(path string, environ []string, euid int) (Config, error) {
	getenv := lookupIn(environ)
	c := defaults(getenv, euid)
	from := origins{}
	var errs []error
	path, what := configPath(path, getenv)
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("reading %s: %w", what, err)
		}
		if err := decodeFile(&c, data, path, from); err != nil {
			errs = append(errs, err)
		}
	}
	if err := applyEnv(&c, environ, from); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return finish(c, from)
}

// configPath picks the file to read: path if given, else the file named by
// the first of KVTIER_CONFIG_FILE and LMCACHE_CONFIG_FILE that is set. what
// describes the choice for error messages.
func configPath(path string, getenv func(string) string) (p, what string) {
	if path != "" {
		return path, "config file"
	}
	for _, v := range []string{envConfigFile, envLMCacheConfigFile} {
		if p := getenv(v); p != "" {
			return p, "config file named by " + v
		}
	}
	return "", ""
}

// finish validates c, points validation errors at their source and returns
// the normalised configuration.
func finish(c Config, from origins) (Config, error) {
	if err := c.Validate(); err != nil {
		for _, ke := range keyErrors(err) {
			if ke.Source == "" {
				ke.Source = from[ke.Key]
			}
		}
		return Config{}, err
	}
	_ = c.normalize() // cannot fail: Validate normalised a copy successfully
	return c, nil
}

// lookupIn returns a getenv over environ. The first entry for a name wins,
// as with os.Getenv.
func lookupIn(environ []string) func(string) string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, seen := m[k]; !seen {
				m[k] = v
			}
		}
	}
	return func(k string) string { return m[k] }
}

func decodeFile(c *Config, data []byte, name string, from origins) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file keeps every default
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: want a single YAML document, found a second one", name)
	}
	return decodeNode(c, &doc, name, from)
}

// decodeNode applies a YAML mapping of keys to c, collecting one error per
// bad key so the user can fix them all in one pass.
func decodeNode(c *Config, n *yaml.Node, name string, from origins) error {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	if isNull(n) {
		return nil // "~" or only comments: keep every default
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: want a mapping of keys to values at the top level, got %s",
			position(name, n.Line), describe(n))
	}
	rv := reflect.ValueOf(c).Elem()
	firstLine := map[string]int{}
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolveAlias(n.Content[i+1])
		src := position(name, k.Line)
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%s: want a key name, got %s", src, describe(k)))
			continue
		}
		key, canonical := k.Value, canonicalKey(k.Value)
		if line, dup := firstLine[canonical]; dup {
			errs = append(errs, &KeyError{Key: key, Source: src,
				Err: fmt.Errorf("%w (first at line %d)", ErrDuplicateKey, line)})
			continue
		}
		firstLine[canonical] = k.Line
		if err := setFromNode(rv, key, v); err != nil {
			errs = append(errs, &KeyError{Key: key, Source: src, Err: err})
			continue
		}
		if from != nil {
			from[canonical] = src
		}
	}
	return errors.Join(errs...)
}

func setFromNode(rv reflect.Value, key string, v *yaml.Node) error {
	if i, ok := fieldIndex[canonicalKey(key)]; ok {
		if isNull(v) {
			return nil
		}
		return decodeField(rv.Field(i), v)
	}
	if def, ok := lmcacheOnly[key]; ok {
		var x any
		if err := v.Decode(&x); err != nil || !holdsDefault(x, def) {
			return unsupported(def)
		}
		return nil
	}
	return unknownKeyError(key)
}

// applyEnv applies every KVTIER_<KEY> variable in environ to c.
func applyEnv(c *Config, environ []string, from origins) error {
	rv := reflect.ValueOf(c).Elem()
	seenVar := map[string]bool{}
	setBy := map[string]string{} // canonical key → variable, to catch synonyms
	var errs []error
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) || name == envConfigFile || seenVar[name] {
			continue
		}
		seenVar[name] = true
		key := strings.ToLower(name[len(envPrefix):])
		canonical, src := canonicalKey(key), "env "+name
		if other, dup := setBy[canonical]; dup {
			errs = append(errs, &KeyError{Key: key, Source: src,
				Err: fmt.Errorf("%w (also by %s)", ErrDuplicateKey, other)})
			continue
		}
		setBy[canonical] = name
		if err := setFromEnv(rv, key, value); err != nil {
			errs = append(errs, &KeyError{Key: key, Source: src, Err: err})
			continue
		}
		from[canonical] = src
	}
	return errors.Join(errs...)
}

func setFromEnv(rv reflect.Value, key, value string) error {
	if i, ok := fieldIndex[canonicalKey(key)]; ok {
		return parseField(rv.Field(i), value)
	}
	if def, ok := lmcacheOnly[key]; ok {
		if !envHoldsDefault(value, def) {
			return unsupported(def)
		}
		return nil
	}
	return unknownKeyError(key)
}

// EnvName is the environment variable that overrides key.
func EnvName(key string) string { return envPrefix + strings.ToUpper(key) }

// Keys lists kvtier's own keys in the order Config declares them.
func Keys() []string { return append([]string(nil), keyOrder...) }

func canonicalKey(key string) string {
	if s, ok := synonyms[key]; ok {
		return s
	}
	return key
}

func unknownKeyError(key string) error {
	if s := nearestKey(key); s != "" {
		return fmt.Errorf("%w (did you mean %s?)", ErrUnknownKey, s)
	}
	return ErrUnknownKey
}

func unsupported(def any) error {
	shown := "null"
	switch d := def.(type) {
	case string:
		shown = strconv.Quote(d)
	case bool, int:
		shown = fmt.Sprint(d)
	}
	return fmt.Errorf("%w; remove it or set it to %s", ErrUnsupported, shown)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// resolveAlias follows *alias references to the anchored value. The depth
// bound is belt and braces: yaml.v3 already rejects self-referencing anchors.
func resolveAlias(n *yaml.Node) *yaml.Node {
	for range 100 {
		if n.Kind != yaml.AliasNode || n.Alias == nil {
			return n
		}
		n = n.Alias
	}
	return n
}

func position(name string, line int) string {
	if name == "" {
		return "line " + strconv.Itoa(line)
	}
	return name + ":" + strconv.Itoa(line)
}
