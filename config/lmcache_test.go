package config

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// loadWarn loads as root with exactly the given environment and returns
// the warnings too.
func loadWarn(t *testing.T, path string, environ ...string) (Config, []warning, error) {
	t.Helper()
	return load(path, environ, 0)
}

// rootDefaults is what loading nothing gives in these tests.
func rootDefaults() Config { return defaults(func(string) string { return "" }, 0) }

func TestLMCacheTableIsConsistent(t *testing.T) {
	if len(lmcacheKeys) != 109 {
		t.Errorf("LMCache 000620e3 defines 109 keys, the table has %d", len(lmcacheKeys))
	}
	counts := map[disposition]int{}
	seen := map[string]bool{}
	for _, k := range append(append([]lmcacheKey(nil), lmcacheKeys...), lmcacheRetired...) {
		counts[k.Disposition]++
		if seen[k.Name] {
			t.Errorf("%s is listed twice", k.Name)
		}
		seen[k.Name] = true
		if !defaultFitsKind(k) {
			t.Errorf("%s: default %#v is not a %s", k.Name, k.Default, k.Kind.want())
		}
		_, isField := fieldIndex[k.Name]
		switch k.Disposition {
		case implemented:
			if k.Target != k.Name || !isField {
				t.Errorf("%s is implemented but is not a kvtier key", k.Name)
			}
		case mapped:
			if _, ok := fieldIndex[k.Target]; !ok || isField || synonyms[k.Name] != k.Target {
				t.Errorf("%s maps to %q, which is not a kvtier key it is a synonym of", k.Name, k.Target)
			}
		default:
			if k.Reason == "" || k.Target != "" || isField {
				t.Errorf("%s is %s: it needs a reason, no target, and no kvtier key of its name", k.Name, k.Disposition)
			}
		}
	}
	for old, cur := range lmcacheAliases {
		if _, ok := lmcacheIndex[cur]; !ok || seen[old] {
			t.Errorf("alias %s → %s: the target must be a key and the alias must not be one", old, cur)
		}
	}
	t.Logf("implemented %d, mapped %d, ignored %d, refused %d; %d aliases, %d retired",
		counts[implemented], counts[mapped], counts[ignored], counts[refused], len(lmcacheAliases), len(lmcacheRetired))
}

func defaultFitsKind(k lmcacheKey) bool {
	switch k.Default.(type) {
	case nil:
		return k.Kind != kindBool
	case bool:
		return k.Kind == kindBool
	case int:
		return k.Kind == kindInt
	case float64:
		return k.Kind == kindFloat
	case string:
		return k.Kind == kindString
	}
	return false
}

// envText writes a default the way a user would put it in a variable.
func envText(def any) string {
	switch d := def.(type) {
	case nil:
		return ""
	case string:
		return d
	case float64:
		return strconv.FormatFloat(d, 'g', -1, 64)
	}
	return showValue(def)
}

// TestEveryLMCacheKeyAtDefaultLoads writes every LMCache key, and every
// older name, at LMCache's default — in a file, as LMCACHE_ variables and
// as KVTIER_ variables — and expects kvtier's defaults, without a warning.
func TestEveryLMCacheKeyAtDefaultLoads(t *testing.T) {
	file := map[string]any{}
	var lmEnv, kvEnv []string
	for _, k := range lmcacheKeys {
		file[k.Name] = k.Default
		lmEnv = append(lmEnv, LMCacheEnvName(k.Name)+"="+envText(k.Default))
		kvEnv = append(kvEnv, EnvName(k.Name)+"="+envText(k.Default))
	}
	doc, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	want := rootDefaults()
	want.CachePolicy = "LRU" // LMCache's default, written out, is honoured; kvtier's own is prefix-aware
	check := func(what string, c Config, ws []warning, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: LMCache defaults rejected: %v", what, err)
		}
		if len(ws) > 0 {
			t.Errorf("%s: LMCache defaults warn: %v", what, ws)
		}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("%s: LMCache defaults are not kvtier's:\n got %+v\nwant %+v", what, c, want)
		}
	}
	path := writeFile(t, "lmcache.yaml", string(doc))
	c, ws, err := loadWarn(t, path)
	check("file", c, ws, err)
	c, ws, err = loadWarn(t, "", lmEnv...)
	check("LMCACHE_ variables", c, ws, err)
	c, ws, err = loadWarn(t, "", kvEnv...)
	check("KVTIER_ variables", c, ws, err)

	// Each older name, alone, at its key's default.
	for old, cur := range lmcacheAliases {
		def := lmcacheIndex[cur].Default
		doc, _ := yaml.Marshal(map[string]any{old: def})
		if _, ws, err := parse(doc, "f.yaml"); err != nil || len(ws) > 0 {
			t.Errorf("%s at its default: %v %v", old, ws, err)
		}
		if _, ws, err := loadWarn(t, "", LMCacheEnvName(old)+"="+envText(def)); err != nil || len(ws) > 0 {
			t.Errorf("%s at its default from the environment: %v %v", old, ws, err)
		}
	}
}

// outcome is what a non-default value should produce.
type outcome struct {
	warn    bool   // a warning (else an error)
	key     string // the key named
	source  string
	contain string // in the warning's reason or the error's message
}

func TestLMCacheNonDefaultValues(t *testing.T) {
	cases := []struct {
		doc  string
		want outcome
	}{
		{"py_enable_gc: false", outcome{true, "py_enable_gc", "f.yaml:1", "not Python"}},
		{"pin_timeout_sec: 60", outcome{true, "pin_timeout_sec", "f.yaml:1", "lease_ttl"}},
		{"blend_special_str: '###'", outcome{true, "blend_special_str", "f.yaml:1", "docs/blend.md"}},
		{"blend_recompute_ratios: [0.15]", outcome{true, "blend_recompute_ratios", "f.yaml:1", "CacheBlend"}},
		{"blend_recompute_ratios: [0, 1]", outcome{true, "blend_recompute_ratios", "f.yaml:1", "engine side"}},
		{"blend_check_layers: [1, 2]", outcome{true, "blend_check_layers", "f.yaml:1", "CacheBlend"}},
		{"blend_min_tokens: 0", outcome{true, "blend_min_tokens", "f.yaml:1", "CacheBlend"}},
		{"blend_recompute_ratios: [0.15, 1.5]", outcome{false, "blend_recompute_ratios", "f.yaml:1", "recompute ratio 1.5 is outside [0, 1]"}},
		{"blend_recompute_ratios: -0.1", outcome{false, "blend_recompute_ratios", "f.yaml:1", "recompute ratio -0.1 is outside [0, 1]"}},
		{"blend_recompute_ratios: [.nan]", outcome{false, "blend_recompute_ratios", "f.yaml:1", "is outside [0, 1]"}},
		{"blend_check_layers: [1, -2]", outcome{false, "blend_check_layers", "f.yaml:1", "check layer -2 is not a layer index"}},
		{"blend_min_tokens: -1", outcome{false, "blend_min_tokens", "f.yaml:1", "want 0 or more tokens"}},
		{"blend_special_str: '  '", outcome{false, "blend_special_str", "f.yaml:1", "non-blank separator"}},
		{"blend_thresholds: [0.5]", outcome{false, "blend_thresholds", "f.yaml:1", "leave blend_thresholds unset"}},
		{"pd_role: sender", outcome{true, "pd_role", "f.yaml:1", "disaggregation"}},
		{"nixl_role: receiver", outcome{true, "nixl_role", "f.yaml:1", "disaggregation"}},
		{"p2p_init_ports: '8000, 8001'", outcome{true, "p2p_init_ports", "f.yaml:1", "P2P"}},
		{"lmcache_worker_port: 8001", outcome{true, "lmcache_worker_port", "f.yaml:1", "controller"}},
		{"pd_allocation_timeout_sec: 30", outcome{true, "pd_allocation_timeout_sec", "f.yaml:1", "disaggregation"}},
		{"enable_kv_events: true", outcome{true, "enable_kv_events", "f.yaml:1", "kv_events_endpoint"}},
		{"mp_port: 6000", outcome{true, "mp_port", "f.yaml:1", "socket_path"}},
		{"nixl_peer_port: 7000", outcome{true, "nixl_peer_port", "f.yaml:1", "deprecated"}},
		{"ec_chunk_size: 64", outcome{true, "ec_chunk_size", "f.yaml:1", "encoder-cache"}},
		{"ec: {max_local_cpu_size: 1}", outcome{true, "ec", "f.yaml:1", "encoder-cache"}},
		{"use_layerwise: true", outcome{true, "use_layerwise", "f.yaml:1", "vLLM connector"}},
		{"enable_blending: on", outcome{true, "enable_blending", "f.yaml:1", "CacheBlend"}},
		{"enable_p2p: true", outcome{false, "enable_p2p", "f.yaml:1", "P2P"}},
		{"enable_controller: true", outcome{true, "enable_controller", "f.yaml:1", "controller_url"}},
		{"controller_reply_url: tcp://c:8301", outcome{true, "controller_reply_url", "f.yaml:1", "no reply address"}},
		{"enable_pd: true", outcome{true, "enable_pd", "f.yaml:1", "vLLM connector"}},
		{"enable_xpyd: true", outcome{true, "enable_xpyd", "f.yaml:1", "vLLM connector"}},
		{"gds_path: /mnt/gds", outcome{false, "gds_path", "f.yaml:1", "set local_disk to it"}},
		{"maru_path: /dev/dax0.0", outcome{false, "maru_path", "f.yaml:1", "set it to null"}},
		{"storage_plugins: [mooncake]", outcome{false, "storage_plugins", "f.yaml:1", "remote_url"}},
		{"external_backends: mooncake", outcome{false, "external_backends", "f.yaml:1", "remote_url"}},
		{"remote_config_url: http://cfg:8000", outcome{false, "remote_config_url", "f.yaml:1", "put the settings in the file"}},
		{"enable_hidden_state_cache: true", outcome{false, "enable_hidden_state_cache", "f.yaml:1", "hidden states"}},
		// Ignored keys still have a type.
		{"pin_timeout_sec: soon", outcome{false, "pin_timeout_sec", "f.yaml:1", `want an integer, got "soon"`}},
		{"p2p_init_ports: [8000, x]", outcome{false, "p2p_init_ports", "f.yaml:1", "want a list of integers"}},
		{"py_enable_gc: [true]", outcome{false, "py_enable_gc", "f.yaml:1", "want true or false, got a list"}},
		{"ec: 1", outcome{false, "ec", "f.yaml:1", "want a mapping"}},
	}
	for _, tc := range cases {
		_, ws, err := parse([]byte(tc.doc+"\n"), "f.yaml")
		checkOutcome(t, tc.doc, ws, err, tc.want)
	}

	envCases := []struct {
		env  string
		want outcome
	}{
		{"LMCACHE_PY_ENABLE_GC=0", outcome{true, "py_enable_gc", "env LMCACHE_PY_ENABLE_GC", "not Python"}},
		{"LMCACHE_LOOKUP_SERVER_WORKER_IDS=0,1", outcome{true, "lookup_server_worker_ids", "env LMCACHE_LOOKUP_SERVER_WORKER_IDS", "lookup"}},
		{"LMCACHE_EC_LOCAL_CPU=false", outcome{true, "ec_local_cpu", "env LMCACHE_EC_LOCAL_CPU", "encoder-cache"}},
		{"KVTIER_NUMA_MODE=auto", outcome{true, "numa_mode", "env KVTIER_NUMA_MODE", "NUMA"}},
		{"LMCACHE_CHUNK_SIZ=128", outcome{true, "chunk_siz", "env LMCACHE_CHUNK_SIZ", "did you mean LMCACHE_CHUNK_SIZE?"}},
		{"LMCACHE_ENABLE_PD=True", outcome{true, "enable_pd", "env LMCACHE_ENABLE_PD", "vLLM connector"}},
		{"KVTIER_ENABLE_CONTROLLER=1", outcome{true, "enable_controller", "env KVTIER_ENABLE_CONTROLLER", "controller_url"}},
		{"LMCACHE_MP_PORT=x", outcome{false, "mp_port", "env LMCACHE_MP_PORT", `want an integer, got "x"`}},
		{"LMCACHE_BLEND_CHECK_LAYERS=1,b", outcome{false, "blend_check_layers", "env LMCACHE_BLEND_CHECK_LAYERS", "want a list of integers"}},
		{"LMCACHE_BLEND_RECOMPUTE_RATIOS=0.1,2", outcome{false, "blend_recompute_ratios", "env LMCACHE_BLEND_RECOMPUTE_RATIOS", "recompute ratio 2.0 is outside [0, 1]"}},
		{"LMCACHE_ENABLE_BLENDING=true", outcome{true, "enable_blending", "env LMCACHE_ENABLE_BLENDING", "docs/blend.md"}},
	}
	for _, tc := range envCases {
		_, ws, err := loadWarn(t, "", tc.env)
		checkOutcome(t, tc.env, ws, err, tc.want)
	}
}

func checkOutcome(t *testing.T, input string, ws []warning, err error, want outcome) {
	t.Helper()
	if want.warn {
		if err != nil || len(ws) != 1 {
			t.Errorf("%s: want one warning, got %v and error %v", input, ws, err)
			return
		}
		w := ws[0]
		if w.Key != want.key || w.Source != want.source || !strings.Contains(w.Reason, want.contain) {
			t.Errorf("%s: got warning %q, want key %s at %s saying %q", input, w, want.key, want.source, want.contain)
		}
		return
	}
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != want.key || ke.Source != want.source || !strings.Contains(err.Error(), want.contain) {
		t.Errorf("%s: got %v, want an error for key %s at %s saying %q", input, err, want.key, want.source, want.contain)
	}
}

func TestLMCacheRefusalsAreErrUnsupported(t *testing.T) {
	for _, k := range lmcacheKeys {
		if k.Disposition != refused {
			continue
		}
		value := "x"
		if k.Kind == kindBool {
			value = "true"
		}
		_, _, err := loadWarn(t, "", LMCacheEnvName(k.Name)+"="+value)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "set it to "+k.showDefault()) {
			t.Errorf("%s=%s: got %v, want ErrUnsupported saying which value is accepted", k.Name, value, err)
		}
	}
}

// An LMCache prefill/decode file is the engine's business: the daemon serves
// both roles, so it starts and says, key by key, that the connector reads them.
func TestLMCachePDConfigIsAcceptedWithWarnings(t *testing.T) {
	_, ws, err := loadWarn(t, "testdata/lmcache_pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, w := range ws {
		got[w.Key] = w.Source
		if !strings.Contains(w.Reason, "docs/disaggregation.md") {
			t.Errorf("%s: reason %q does not point to docs/disaggregation.md", w.Key, w.Reason)
		}
	}
	want := map[string]string{
		"enable_pd": "testdata/lmcache_pd.yaml:6", "pd_role": "testdata/lmcache_pd.yaml:7",
		"pd_buffer_size": "testdata/lmcache_pd.yaml:8", "pd_buffer_device": "testdata/lmcache_pd.yaml:9",
		"pd_proxy_host": "testdata/lmcache_pd.yaml:10", "pd_proxy_port": "testdata/lmcache_pd.yaml:11",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("warnings by key:\n got %v\nwant %v", got, want)
	}
}

func TestLMCacheVariables(t *testing.T) {
	file := writeFile(t, "lmcache.yaml", "chunk_size: 128\nremote_serde: lz4\n")
	c, ws, err := loadWarn(t, file,
		"LMCACHE_CHUNK_SIZE=512",                  // over the file
		"LMCACHE_LOCAL_CPU_USE_HUGEPAGES=True",    // a mapped key
		`LMCACHE_REMOTE_SERDE="naive"`,            // quoted, as LMCache allows
		`LMCACHE_EXTRA_CONFIG={"use_odirect": 1}`, // JSON
		"LMCACHE_MAX_LOCAL_CPU_SIZE=2",
		"KVTIER_MAX_LOCAL_CPU_SIZE=3", // KVTIER_ wins over LMCACHE_
		// LMCache's own variables outside its configuration are left alone.
		"LMCACHE_LOG_LEVEL=DEBUG", "LMCACHE_USE_EXPERIMENTAL=True", "LMCACHE_CONFIG_FILE=/nonexistent",
	)
	if err != nil || len(ws) > 0 {
		t.Fatalf("got warningSet %v, error %v", ws, err)
	}
	if c.ChunkSize != 512 || !c.Hugepages || c.RemoteSerde != "raw" || c.MaxLocalCPUSize != 3 ||
		!reflect.DeepEqual(c.ExtraConfig, map[string]any{"use_odirect": 1}) {
		t.Errorf("LMCACHE_ variables not applied: %+v", c)
	}
	_, _, err = loadWarn(t, "", "LMCACHE_ENABLE_XPYD=false", "LMCACHE_ENABLE_PD=false")
	if !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("an older name and its key, both set: got %v", err)
	}
	_, _, err = loadWarn(t, "", "LMCACHE_CHUNK_SIZE=0")
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Source != "env LMCACHE_CHUNK_SIZE" {
		t.Errorf("a bad value must name the variable: %v", err)
	}
}

// TestWarningsOncePerKey: a key set in several places is reported once, for
// the value that counts, and not at all when that value is the default.
func TestWarningsOncePerKey(t *testing.T) {
	file := writeFile(t, "lmcache.yaml", "py_enable_gc: false\n")
	_, ws, err := loadWarn(t, file, "LMCACHE_PY_ENABLE_GC=false", "KVTIER_PY_ENABLE_GC=false")
	if err != nil || len(ws) != 1 || ws[0].Source != "env KVTIER_PY_ENABLE_GC" {
		t.Errorf("want one warning, from the last source: %v %v", ws, err)
	}
	_, ws, err = loadWarn(t, file, "LMCACHE_PY_ENABLE_GC=true")
	if err != nil || len(ws) != 0 {
		t.Errorf("put back to the default, no warning: %v %v", ws, err)
	}

	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	if _, err := Parse([]byte("py_enable_gc: false\npin_timeout_sec: 5\nchunk_size: 256\n"), "f.yaml"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Count(out, "level=WARN") != 2 || !strings.Contains(out, "key=py_enable_gc source=f.yaml:1 value=false") ||
		!strings.Contains(out, "key=pin_timeout_sec source=f.yaml:2 value=5") {
		t.Errorf("log:\n%s", out)
	}
}

func TestUnknownKeyNamesTheClosest(t *testing.T) {
	cases := map[string]string{
		"py_enable_gcc: true\n":   "did you mean py_enable_gc?",
		"enable_pdd: true\n":      "did you mean enable_pd?",
		"lmcache_worker_prt: 1\n": "did you mean lmcache_worker_port?",
		"ec_bogus: 1\n":           "unknown key",
	}
	for doc, want := range cases {
		_, err := Parse([]byte(doc), "f.yaml")
		if !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want ErrUnknownKey with %q", doc, err, want)
		}
	}
	_, _, err := loadWarn(t, "", "KVTIER_PIN_TIMEOUT_SECS=1")
	if !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "did you mean pin_timeout_sec?") {
		t.Errorf("KVTIER_ typo: %v", err)
	}
}

func TestLMCacheWarningsHideSecrets(t *testing.T) {
	_, ws, err := parse([]byte("audit_actual_remote_url: redis://app:hunter2@cache:6379\n"), "f.yaml")
	if err != nil || len(ws) != 1 || strings.Contains(ws[0].String(), "hunter2") || !strings.Contains(ws[0].Value, "REDACTED") {
		t.Errorf("got %v, %v", ws, err)
	}
}

func TestShowValue(t *testing.T) {
	cases := map[string]any{
		"null": nil, "5.0": 5.0, "inf": math.Inf(1), "0.005": 0.005, "256": 256, `" # # "`: " # # ",
		"[1, 2]": []int64{1, 2}, `["a"]`: []string{"a"}, "[0.5]": []float64{0.5}, "true": true,
		"[1, 2, 3, 4, 5, 6, 7, 8, …]": []int64{1, 2, 3, 4, 5, 6, 7, 8, 9},
	}
	for want, v := range cases {
		if got := showValue(v); got != want {
			t.Errorf("showValue(%#v) = %s, want %s", v, got, want)
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestLMCacheControllerKeysMap checks LMCache's controller settings land
// on kvtier's cluster keys.
func TestLMCacheControllerKeysMap(t *testing.T) {
	doc := "enable_controller: true\nlmcache_instance_id: node-a\ncontroller_pull_url: c:7481\ntcp_addr: 127.0.0.1:7482\ncluster_events_endpoint: tcp://*:7483\n"
	cfg, _, err := parse([]byte(doc), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InstanceID != "node-a" || cfg.ControllerURL != "c:7481" {
		t.Fatalf("instance_id %q, controller_url %q", cfg.InstanceID, cfg.ControllerURL)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("LMCache's host:port form refused: %v", err)
	}
}

// TestLMCacheP2PConfigLoads loads an LMCache P2P-with-controller
// configuration, from a file and from LMCACHE_* variables: every key is
// accepted, the switches and identity land on kvtier's keys, LMCache's own
// listener addresses warn, and the result joins the controller with a P2P
// tier that finds peers through it.
func TestLMCacheP2PConfigLoads(t *testing.T) {
	check := func(name string, cfg Config, ws []warning, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !cfg.EnableP2P || cfg.InstanceID != "node-a" || cfg.ControllerURL != "tcp://10.0.0.9:5555" || len(cfg.P2PPeers) != 0 {
			t.Fatalf("%s: enable_p2p %v, instance_id %q, controller_url %q, p2p_peers %v", name, cfg.EnableP2P, cfg.InstanceID, cfg.ControllerURL, cfg.P2PPeers)
		}
		if base, err := cfg.ControllerBase(); err != nil || base != "http://10.0.0.9:5555" {
			t.Fatalf("%s: controller base %q, %v", name, base, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var keys []string
		for _, w := range ws {
			keys = append(keys, w.Key)
		}
		slices.Sort(keys)
		want := []string{"controller_reply_url", "enable_controller", "p2p_host", "p2p_init_ports"}
		if !slices.Equal(keys, want) {
			t.Fatalf("%s: warnings for %v, want %v", name, keys, want)
		}
	}
	doc := "enable_p2p: true\np2p_host: 10.0.0.2\np2p_init_ports: [6000, 6001]\nenable_controller: true\n" +
		"lmcache_instance_id: node-a\ncontroller_pull_url: tcp://10.0.0.9:5555\ncontroller_reply_url: tcp://10.0.0.9:5556\n" +
		"tcp_addr: 10.0.0.2:7482\ntcp_token: t\ncluster_events_endpoint: tcp://*:5561\n"
	cfg, ws, err := parse([]byte(doc), "lmcache.yaml")
	check("file", cfg, ws, err)
	cfg, ws, err = loadWarn(t, "", "LMCACHE_ENABLE_P2P=True", "LMCACHE_P2P_HOST=10.0.0.2", "LMCACHE_P2P_INIT_PORTS=6000,6001",
		"LMCACHE_ENABLE_CONTROLLER=True", "LMCACHE_LMCACHE_INSTANCE_ID=node-a", "LMCACHE_CONTROLLER_PULL_URL=tcp://10.0.0.9:5555",
		"LMCACHE_CONTROLLER_REPLY_URL=tcp://10.0.0.9:5556", "KVTIER_TCP_ADDR=10.0.0.2:7482", "KVTIER_TCP_TOKEN=t",
		"KVTIER_CLUSTER_EVENTS_ENDPOINT=tcp://*:5561")
	check("environment", cfg, ws, err)
}
