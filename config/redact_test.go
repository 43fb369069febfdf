package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"":                                     "",
		"redis://cache:6379":                   "redis://cache:6379",
		"redis://:hunter2@cache:6379/0":        "redis://:REDACTED@cache:6379/0",
		"redis://app:hunter2@cache:6379":       "redis://app:REDACTED@cache:6379",
		"https://ghp_token123@host/x":          "https://REDACTED@host/x",
		"s3://bucket/p?region=us&secret_key=k": "s3://bucket/p?region=us&secret_key=REDACTED",
		"s3://b?AccessKeyId=A&X-Amz-Signature=s&token=t&x=1": "s3://b?AccessKeyId=REDACTED&X-Amz-Signature=REDACTED&token=REDACTED&x=1",
		"redis://h?password=p%40ss":                          "redis://h?password=REDACTED",
		"redis://h?pass%77ord=x":                             "redis://h?password=REDACTED", // escaped names are seen through
		"lm://localhost:65432?keyless=1":                     "lm://localhost:65432?keyless=1",
		"redis://a:b@h:port":                                 "REDACTED", // unparseable: hide it all
	}
	for in, want := range cases {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactedConfig(t *testing.T) {
	c := Default()
	c.RemoteURL = "redis://u:pw@h:1"
	c.ExtraConfig = map[string]any{
		"s3_access_key": "AKIA",
		"aws":           map[string]any{"SecretAccessKey": "s", "region": "eu"},
		"endpoints":     []any{"redis://x:pw2@h", 3},
		"chunk_meta":    true,
	}
	r := c.Redacted()
	want := map[string]any{
		"s3_access_key": "REDACTED",
		"aws":           map[string]any{"SecretAccessKey": "REDACTED", "region": "eu"},
		"endpoints":     []any{"redis://x:REDACTED@h", 3},
		"chunk_meta":    true,
	}
	if r.RemoteURL != "redis://u:REDACTED@h:1" || !reflect.DeepEqual(r.ExtraConfig, want) {
		t.Errorf("Redacted() = %q %#v", r.RemoteURL, r.ExtraConfig)
	}
	// The original is untouched, nested maps included.
	if c.RemoteURL != "redis://u:pw@h:1" || c.ExtraConfig["aws"].(map[string]any)["SecretAccessKey"] != "s" ||
		c.ExtraConfig["endpoints"].([]any)[0] != "redis://x:pw2@h" {
		t.Errorf("Redacted modified its receiver: %#v", c.ExtraConfig)
	}
}

func TestRedactedTokens(t *testing.T) {
	c := Default()
	c.TCPToken, c.ControllerToken = "fleet", "cluster"
	r := c.Redacted()
	if r.TCPToken != "REDACTED" || r.ControllerToken != "REDACTED" || c.ControllerToken != "cluster" {
		t.Errorf("tcp_token %q, controller_token %q (original %q)", r.TCPToken, r.ControllerToken, c.ControllerToken)
	}
	if r := Default().Redacted(); r.ControllerToken != "" {
		t.Errorf("an empty controller_token reads %q", r.ControllerToken)
	}
}

// TestRedactedNonStringKeys: a nested mapping with a non-string key decodes
// as map[any]any; secrets inside it must be hidden too.
func TestRedactedNonStringKeys(t *testing.T) {
	c, err := Parse([]byte("extra_config:\n  backends:\n    1: {password: hunter2}\n    token: abc\n"), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := c.Redacted().String()
	if strings.Contains(out, "hunter2") || strings.Contains(out, "abc") {
		t.Fatalf("secret leaked:\n%s", out)
	}
	if !strings.Contains(c.String(), "REDACTED") {
		t.Fatalf("String() shows no redaction:\n%s", c.String())
	}
}

// TestRedactedEveryToken: every string key whose name says it is a secret
// (admin_token, tcp_token, controller_token and any added later) reads
// REDACTED, so /api/v1/config and the logs never show one.
func TestRedactedEveryToken(t *testing.T) {
	c := Default()
	v := reflect.ValueOf(&c).Elem()
	var secret []string
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() == reflect.String && looksSecret(tagName(f)) {
			v.Field(i).SetString("plain-" + tagName(f))
			secret = append(secret, tagName(f))
		}
	}
	if !slices.Contains(secret, "admin_token") {
		t.Fatalf("admin_token is not among the secret keys %v", secret)
	}
	r := reflect.ValueOf(c.Redacted())
	for i := range r.NumField() {
		f := r.Type().Field(i)
		if slices.Contains(secret, tagName(f)) && r.Field(i).String() != "REDACTED" {
			t.Errorf("%s reads %q after Redacted", tagName(f), r.Field(i).String())
		}
	}
}
