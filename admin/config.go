package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"kvtier/config"
)

// configJSON renders c, secrets hidden, as one JSON object keyed by the
// configuration's own key names in the order of docs/configuration.md.
// Values read as they would in the file: durations as "5ms", sizes as
// "256MiB" (config.Size marshals itself as text).
func configJSON(c config.Config) ([]byte, error) {
	v := reflect.ValueOf(c.Redacted())
	t := v.Type()
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		val := v.Field(i).Interface()
		if d, ok := val.(time.Duration); ok {
			val = d.String()
		}
		enc, err := json.Marshal(val)
		if err != nil { // extra_config may hold maps JSON cannot key
			return nil, fmt.Errorf("admin: rendering config key %s: %w", name, err)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		key, _ := json.Marshal(name)
		b.Write(key)
		b.WriteByte(':')
		b.Write(enc)
	}
	b.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, fmt.Errorf("admin: rendering config: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
