package config

import (
	"fmt"
	"net/url"
	"strings"
)

const redacted = "REDACTED"

// Redacted returns a copy fit for display: secrets in remote_url (the
// password of its userinfo, a bare userinfo token, secret-looking query
// parameters), tcp_token, admin_token, controller_token, and secret-looking extra_config entries read REDACTED.
func (c Config) Redacted() Config {
	urls := c.RemoteURLs()
	for i, u := range urls {
		urls[i] = redactURL(u)
	}
	if len(urls) > 0 {
		c.RemoteURL = strings.Join(urls, " ")
	}
	if c.TCPToken != "" {
		c.TCPToken = redacted
	}
	if c.AdminToken != "" {
		c.AdminToken = redacted
	}
	if c.ControllerToken != "" {
		c.ControllerToken = redacted
	}
	if c.ExtraConfig != nil {
		c.ExtraConfig = redactMap(c.ExtraConfig)
	}
	c.Tenants = redactTenants(c.Tenants)
	return c
}

// redactURL hides the secrets of a URL and otherwise leaves its text as
// written. A URL that does not parse is hidden whole: we cannot tell which
// part is secret.
func redactURL(s string) string {
	if s == "" {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return redacted
	}
	changed := false
	if u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword {
			u.User = url.UserPassword(u.User.Username(), redacted)
			changed = true
		} else if u.User.Username() != "" {
			// A lone userinfo is how tokens travel (https://TOKEN@host).
			u.User = url.User(redacted)
			changed = true
		}
	}
	if u.RawQuery != "" {
		if q, ok := redactQuery(u.RawQuery); ok {
			u.RawQuery = q
			changed = true
		}
	}
	if !changed {
		return s
	}
	return u.String()
}

// redactQuery blanks secret-looking parameters, keeping their order.
func redactQuery(raw string) (string, bool) {
	parts := strings.Split(raw, "&")
	changed := false
	for i, p := range parts {
		name, _, _ := strings.Cut(p, "=")
		if unescaped, err := url.QueryUnescape(name); err == nil {
			name = unescaped
		}
		if looksSecret(name) {
			parts[i] = url.QueryEscape(name) + "=" + redacted
			changed = true
		}
	}
	return strings.Join(parts, "&"), changed
}

// redactMap copies m, hiding the values of secret-looking keys at any depth.
func redactMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = redactValue(k, v)
	}
	return out
}

func redactValue(key string, v any) any {
	if looksSecret(key) {
		return redacted
	}
	switch x := v.(type) {
	case map[string]any:
		return redactMap(x)
	case map[any]any: // YAML mappings whose keys are not all strings
		out := make(map[any]any, len(x))
		for k, item := range x {
			out[k] = redactValue(fmt.Sprint(k), item)
		}
		return out
	case []any:
		items := make([]any, len(x))
		for i, item := range x {
			items[i] = redactValue("", item)
		}
		return items
	case string:
		if strings.Contains(x, "://") {
			return redactURL(x) // URLs in extra_config may carry passwords too
		}
	}
	return v
}

// secretWords are name fragments that mark a credential. Names are compared
// lower case with "_" and "-" removed, so secret_key, Secret-Key and
// secretKey all match.
var secretWords = []string{
	"password", "passwd", "pwd", "secret", "token", "credential",
	"apikey", "accesskey", "privatekey", "auth", "signature", "sessionkey",
}

func looksSecret(name string) bool {
	n := strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(name))
	if n == "key" || n == "sig" || n == "pass" {
		return true
	}
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}
