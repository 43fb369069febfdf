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

// Environment variables. Every other KVTIER_ variable must name a key;
// LMCACHE_ variables are read only when they name an LMCache key, since
// LMCache uses that prefix for other settings too.
const (
	envPrefix            = "KVTIER_"
	envConfigFile        = "KVTIER_CONFIG_FILE"
	envLMCachePrefix     = "LMCACHE_"
	envLMCacheConfigFile = "LMCACHE_CONFIG_FILE"
)

// origins records where each key's final value came from, so that a
// validation error can point at the file line or variable to fix.
type origins map[string]string

// Load reads the YAML file at path — or, when path is "", the file named by
// KVTIER_CONFIG_FILE or else LMCACHE_CONFIG_FILE, if either is set — applies
// the LMCACHE_<KEY> and then the KVTIER_<KEY> environment overrides and
// validates the result. Settings accepted without effect are logged once
// each as warnings.
func Load(path string) (Config, error) {
	c, ws, err := load(path, os.Environ(), os.Geteuid())
	logWarnings(ws)
	return c, err
}

// FromEnv is Load("") with environ (KEY=value entries, as os.Environ
// returns) in place of the process environment.
func FromEnv(environ []string) (Config, error) {
	c, ws, err := load("", environ, os.Geteuid())
	logWarnings(ws)
	return c, err
}

// Parse decodes a YAML document over the defaults and validates it, without
// looking at the environment. name labels positions in errors.
func Parse(data []byte, name string) (Config, error) {
	c, ws, err := parse(data, name)
	logWarnings(ws)
	return c, err
}

func parse(data []byte, name string) (Config, []warning, error) {
	c := Default()
	from, ws := origins{}, warningSet{}
	if err := decodeFile(&c, data, name, from, ws); err != nil {
		return Config{}, nil, err
	}
	c, err := finish(c, from)
	if err != nil {
		return Config{}, nil, err
	}
	return c, ws.list(), nil
}

// UnmarshalYAML decodes with the same strictness as Parse, so a Config
// embedded in a larger document is checked too. It does not validate.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	ws := warningSet{}
	if err := decodeNode(c, n, "", nil, ws); err != nil {
		return err
	}
	logWarnings(ws.list())
	return nil
}

// load is Load with its inputs explicit and its warnings returned rather
// than logged. Warnings are dropped when loading fails: the errors come
// first.
func load(path string, environ []string, euid int) (Config, []warning, error) {
	getenv := lookupIn(environ)
	c := defaults(getenv, euid)
	from, ws := origins{}, warningSet{}
	var errs []error
	path, what := configPath(path, getenv)
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, nil, fmt.Errorf("reading %s: %w", what, err)
		}
		if err := decodeFile(&c, data, path, from, ws); err != nil {
			errs = append(errs, err)
		}
	}
	if err := applyEnv(&c, environ, from, ws); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return Config{}, nil, errors.Join(errs...)
	}
	c, err := finish(c, from)
	if err != nil {
		return Config{}, nil, err
	}
	return c, ws.list(), nil
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

func decodeFile(c *Config, data []byte, name string, from origins, ws warningSet) error {
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
	return decodeNode(c, &doc, name, from, ws)
}

// decodeNode applies a YAML mapping of keys to c, collecting one error per
// bad key so the user can fix them all in one pass, and one warning per
// setting that has no effect.
func decodeNode(c *Config, n *yaml.Node, name string, from origins, ws warningSet) error {
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
		w, err := setFromNode(rv, key, v)
		if err != nil {
			errs = append(errs, &KeyError{Key: key, Source: src, Err: err})
			continue
		}
		ws.set(canonical, w, key, src)
		if from != nil {
			from[canonical] = src
		}
	}
	return errors.Join(errs...)
}

// setFromNode applies one key of the file. It returns a warning for an
// LMCache setting that is accepted but has no effect.
func setFromNode(rv reflect.Value, key string, v *yaml.Node) (*warning, error) {
	canonical := canonicalKey(key)
	if i, ok := fieldIndex[canonical]; ok {
		if isNull(v) {
			return nil, nil
		}
		return nil, decodeField(rv.Field(i), v)
	}
	if k, ok := lmcacheIndex[canonical]; ok {
		x, err := k.Kind.decode(v)
		if err != nil {
			return nil, err
		}
		return k.check(x)
	}
	decode := func(kind valueKind) (any, error) { return kind.decode(v) }
	if w, ok, err := ecOverride(key, decode); ok {
		return w, err
	}
	return nil, unknownKeyError(key)
}

// applyEnv applies the LMCACHE_<KEY> variables in environ to c, then the
// KVTIER_<KEY> ones, so that a KVTIER_ variable overrides an LMCACHE_ one.
func applyEnv(c *Config, environ []string, from origins, ws warningSet) error {
	rv := reflect.ValueOf(c).Elem()
	return errors.Join(
		applyEnvPrefix(rv, environ, envLMCachePrefix, from, ws),
		applyEnvPrefix(rv, environ, envPrefix, from, ws))
}

// applyEnvPrefix applies the variables of one prefix. Within a prefix a
// key set twice, through synonyms, is an error.
func applyEnvPrefix(rv reflect.Value, environ []string, prefix string, from origins, ws warningSet) error {
	seenVar := map[string]bool{}
	setBy := map[string]string{} // canonical key → variable, to catch synonyms
	var errs []error
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, prefix) || seenVar[name] {
			continue
		}
		seenVar[name] = true
		key := strings.ToLower(name[len(prefix):])
		if !readVar(prefix, name, key, ws) {
			continue
		}
		if prefix == envLMCachePrefix {
			value = unquote(value)
		}
		canonical, src := canonicalKey(key), "env "+name
		if other, dup := setBy[canonical]; dup {
			errs = append(errs, &KeyError{Key: key, Source: src,
				Err: fmt.Errorf("%w (also by %s)", ErrDuplicateKey, other)})
			continue
		}
		setBy[canonical] = name
		w, err := setFromEnv(rv, key, value)
		if err != nil {
			errs = append(errs, &KeyError{Key: key, Source: src, Err: err})
			continue
		}
		ws.set(canonical, w, key, src)
		from[canonical] = src
	}
	return errors.Join(errs...)
}

// readVar reports whether a variable is a key to apply. Every KVTIER_
// variable but KVTIER_CONFIG_FILE is; an LMCACHE_ variable is when it names
// an LMCache key. One that looks like a misspelt LMCache key is reported
// as a warning rather than an error: LMCache itself only warns about it.
func readVar(prefix, name, key string, ws warningSet) bool {
	if prefix == envPrefix {
		return name != envConfigFile
	}
	if name == envLMCacheConfigFile {
		return false
	}
	if isLMCacheVar(key) {
		return true
	}
	if s := nearestIn(key, lmcacheNameList); s != "" {
		ws.set("env "+name, &warning{Value: "this variable",
			Reason: "no LMCache option is named " + key + ", so LMCache ignores it too (did you mean " +
				envLMCachePrefix + strings.ToUpper(s) + "?)"}, key, "env "+name)
	}
	return false
}

// setFromEnv applies one environment variable. It returns a warning for an
// LMCache setting that is accepted but has no effect.
func setFromEnv(rv reflect.Value, key, value string) (*warning, error) {
	canonical := canonicalKey(key)
	if i, ok := fieldIndex[canonical]; ok {
		return nil, parseField(rv.Field(i), value)
	}
	if k, ok := lmcacheIndex[canonical]; ok {
		x, err := k.Kind.parse(value)
		if err != nil {
			return nil, err
		}
		return k.check(x)
	}
	parse := func(kind valueKind) (any, error) { return kind.parse(value) }
	if w, ok, err := ecOverride(key, parse); ok {
		return w, err
	}
	return nil, unknownKeyError(key)
}

// EnvName is the environment variable that overrides key.
func EnvName(key string) string { return envPrefix + strings.ToUpper(key) }

// LMCacheEnvName is LMCache's environment variable for key, which kvtier
// reads too when key is one of LMCache's.
func LMCacheEnvName(key string) string { return envLMCachePrefix + strings.ToUpper(key) }

// Keys lists kvtier's own keys in the order Config declares them.
func Keys() []string { return append([]string(nil), keyOrder...) }

// canonicalKey is the key a name sets: LMCache's older names resolve to
// the current LMCache key, and mapped LMCache keys to the kvtier key.
func canonicalKey(key string) string {
	key = lmcacheName(key)
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
