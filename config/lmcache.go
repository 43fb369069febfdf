package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// LMCache's configuration keys and what kvtier does with each.
//
// The table lists every key of LMCache's _CONFIG_DEFINITIONS in
// lmcache/v1/config.py (LMCache commit 000620e3, 109 keys), in LMCache's
// order, with LMCache's default. A file or environment written for LMCache
// must load: a key LMCache has is never "unknown" here. What happens to a
// value depends on the key's disposition:
//
//   - implemented: a kvtier key of the same name and meaning;
//   - mapped: sets a kvtier key of another name;
//   - ignored: accepted; a value other than LMCache's default has no effect
//     in kvtier and is logged once as a warning, saying why;
//   - refused: accepted at LMCache's default; any other value is an error,
//     because running without it would silently change what is stored or
//     returned, or drop a store the user asked for.
//
// docs/configuration.md carries this table, generated from it (see
// TestDocsLMCacheTable), so the two cannot drift.

// disposition is what kvtier does with an LMCache key.
type disposition uint8

const (
	implemented disposition = iota
	mapped
	ignored
	refused
)

func (d disposition) String() string {
	switch d {
	case implemented:
		return "implemented"
	case mapped:
		return "mapped"
	case ignored:
		return "ignored"
	case refused:
		return "refused"
	}
	return "disposition(" + strconv.Itoa(int(d)) + ")"
}

// valueKind is the type LMCache gives a key's value. kvtier checks it even
// for keys it ignores, so a malformed value is reported rather than
// silently dropped.
type valueKind uint8

const (
	kindBool valueKind = iota
	kindInt
	kindFloat
	kindString
	kindInts    // list[int]: a YAML list, one number, or "1,2,3"
	kindFloats  // list[float], likewise
	kindStrings // list[str]: a YAML list or "a,b"
	kindMap
)

// lmcacheKey is one row of the table. Default is LMCache's default as Go
// reads it: bool, int, float64, string, or nil for Python's None.
type lmcacheKey struct {
	Name        string
	Kind        valueKind
	Default     any
	Disposition disposition
	Target      string // the kvtier key, for implemented and mapped keys
	Reason      string // why, for ignored and refused keys; refusals say what to do
	// Valid, when set, rejects values the key's owner would refuse even
	// though the daemon does not act on them, so a bad setting is reported
	// when the file is loaded rather than by the engine later.
	Valid func(v any) error
}

func same(name string, k valueKind, def any) lmcacheKey {
	return lmcacheKey{Name: name, Kind: k, Default: def, Disposition: implemented, Target: name}
}

func mapsTo(name, target string, k valueKind, def any) lmcacheKey {
	return lmcacheKey{Name: name, Kind: k, Default: def, Disposition: mapped, Target: target}
}

func ignore(name string, k valueKind, def any, why string) lmcacheKey {
	return lmcacheKey{Name: name, Kind: k, Default: def, Disposition: ignored, Reason: why}
}

func refuse(name string, k valueKind, def any, why string) lmcacheKey {
	return lmcacheKey{Name: name, Kind: k, Default: def, Disposition: refused, Reason: why}
}

// Reasons shared by the settings of one LMCache feature. A feature kvtier
// lacks is refused at its switch; its other settings do nothing while the
// switch is off, in LMCache as in kvtier, so they only warn.
const (
	whyLayerwise  = "a setting of the engine side: kvtier's vLLM connector reads use_layerwise (from kv_connector_extra_config or LMCACHE_USE_LAYERWISE) as its layerwise setting, and the daemon streams a prefix layer by layer to any connector that asks (docs/layerwise.md)"
	whyBlend      = "a CacheBlend setting of the engine side: kvtier's blender (python/kvtier/blend.py) reads enable_blending and the blend_* keys from the connector's configuration, and the daemon stores segment K/V like any chunk (docs/blend.md)"
	whyP2P        = "LMCache's P2P listener; kvtier's peers reach a daemon at its tcp_addr: set controller_url (peers found through the controller) or list them in p2p_peers"
	whyController = "an LMCache controller worker setting; the kvtier controller reaches a daemon at the admin and TCP addresses it registers"
	whyPD         = "a prefill/decode disaggregation setting of the engine side: kvtier's vLLM connector reads enable_pd, pd_role and pd_peer_host/pd_peer_init_port from its kv_connector_extra_config; a daemon serves both roles and takes pushes at its tcp_addr (docs/disaggregation.md)"
	whyNIXL       = "a NIXL transfer setting; kvtier does not move KV with NIXL"
	whyGDS        = "a setting of LMCache's GPU Direct Storage tier, which kvtier does not have (gds_path is refused)"
	whyMaru       = "a setting of LMCache's CXL shared-memory tier, which kvtier does not have (maru_path is refused)"
	whyMP         = "the address of LMCache's multiprocess server; engines reach kvtier at socket_path, or at tcp_addr from other hosts"
	whyInternal   = "LMCache's per-worker internal API server; kvtier's HTTP admin API always listens on admin_addr"
	whyCostAware  = "tunes LMCache's cost-aware eviction policy, which kvtier does not have (cache_policy lists kvtier's)"
	whyLazy       = "LMCache's lazy pinned-memory allocator; kvtier's RAM tier is one memfd mapping whose pages are committed on first use (see prefault)"
	whyStats      = "LMCache's chunk statistics; kvtier's counters are on /metrics at admin_addr"
	whyLookup     = "tunes LMCache's scheduler-side lookup client; kvtier's connector asks the daemon directly"
	whyPlugins    = "kvtier runs no LMCache runtime plugins"
	whyPin        = "kvtier's pins are leases that lapse after lease_ttl unless renewed, so no pin outlives its holder"
	whyHidden     = "a setting of the hidden-state cache, which kvtier does not have (enable_hidden_state_cache is refused)"
	whyLocations  = "kvtier writes every enabled tier and reads them fastest first; the tiers are local_cpu, local_disk and remote_url"
	whyStorePlug  = "kvtier does not load LMCache's Python storage backends: name remote stores in remote_url (redis://, s3://, fs://, kvtier://)"
)

// lmcacheKeys is LMCache's _CONFIG_DEFINITIONS, key by key.
var lmcacheKeys = []lmcacheKey{
	same("chunk_size", kindInt, 256),
	same("local_cpu", kindBool, true),
	same("max_local_cpu_size", kindFloat, 5.0),
	mapsTo("local_cpu_use_hugepages", "hugepages", kindBool, false),
	ignore("reserve_local_cpu_size", kindFloat, 0.0,
		"LMCache subtracts it from free memory only for extra_config.save_only_first_rank; kvtier sizes the RAM tier by max_local_cpu_size alone"),
	same("local_disk", kindString, nil),
	ignore("local_disk_path_sharding", kindString, "by_gpu",
		"one kvtier daemon per node owns local_disk for all its GPUs; there are no per-GPU subdirectories"),
	same("max_local_disk_size", kindFloat, 0.0),
	same("remote_url", kindString, nil),
	same("remote_serde", kindString, "naive"),
	ignore("use_layerwise", kindBool, false, whyLayerwise),
	same("save_decode_cache", kindBool, false),
	ignore("pre_caching_hash_algorithm", kindString, "builtin",
		"kvtier keys chunks with its own hash, the same in every process and on every machine; engine-native block hashes are chosen by the connector"),
	ignore("enable_blending", kindBool, false, whyBlend),
	checked(ignore("blend_recompute_ratios", kindFloats, nil, whyBlend), validBlendRatios),
	checked(ignore("blend_thresholds", kindFloats, nil, whyBlend), validBlendThresholds),
	checked(ignore("blend_check_layers", kindInts, nil, whyBlend), validBlendLayers),
	checked(ignore("blend_min_tokens", kindInt, 256, whyBlend), validBlendMinTokens),
	checked(ignore("blend_special_str", kindString, " # # ", whyBlend), validBlendMarker),
	ignore("retrieve_locations", kindStrings, nil, whyLocations),
	ignore("store_location", kindString, nil, whyLocations),
	same("enable_p2p", kindBool, false),
	ignore("p2p_host", kindString, nil, whyP2P),
	ignore("p2p_init_ports", kindInts, nil, whyP2P),
	ignore("p2p_lookup_ports", kindInts, nil, whyP2P),
	ignore("mp_host", kindString, nil, whyMP),
	ignore("mp_port", kindInt, 5555, whyMP),
	ignore("enable_controller", kindBool, false, "kvtier joins the controller whenever controller_url (LMCache's controller_pull_url) is set; the switch adds nothing"),
	mapsTo("lmcache_instance_id", "instance_id", kindString, nil),
	mapsTo("controller_pull_url", "controller_url", kindString, nil),
	ignore("controller_reply_url", kindString, nil, "kvtier's registry answers on the connection to controller_url; no reply address is needed"),
	ignore("lmcache_worker_ports", kindInts, nil, whyController),
	ignore("lmcache_worker_ids", kindInts, nil, whyController),
	ignore("lmcache_worker_heartbeat_delay_time", kindInt, 10, whyController),
	ignore("lmcache_worker_heartbeat_time", kindInt, nil, whyController),
	ignore("enable_pd", kindBool, false, whyPD),
	ignore("pd_role", kindString, nil, whyPD),
	ignore("pd_buffer_size", kindInt, nil, whyPD),
	ignore("pd_buffer_device", kindString, nil, whyPD),
	ignore("pd_peer_host", kindString, nil, whyPD),
	ignore("pd_peer_init_port", kindInts, nil, whyPD),
	ignore("pd_peer_alloc_port", kindInts, nil, whyPD),
	ignore("pd_peer_query_port", kindInts, nil, whyPD),
	ignore("pd_proxy_host", kindString, nil, whyPD),
	ignore("pd_proxy_port", kindInt, nil, whyPD),
	ignore("pd_allocation_timeout_sec", kindFloat, math.Inf(1), whyPD),
	ignore("pd_shutdown_timeout_sec", kindFloat, 5.0, whyPD),
	ignore("pd_condition_poll_interval_sec", kindFloat, 0.005, whyPD),
	ignore("pd_max_prefill_len", kindInt, 0, whyPD),
	ignore("pd_backend_mode", kindString, "async", whyPD),
	ignore("pd_skip_proxy_notification", kindBool, false, whyPD),
	ignore("pd_bidirectional", kindBool, false, whyPD),
	ignore("transfer_channel", kindString, nil,
		"the transfer channel of P2P sharing and disaggregation, neither of which is supported yet"),
	ignore("nixl_backends", kindStrings, nil, whyNIXL),
	ignore("nixl_buffer_size", kindInt, nil, whyNIXL),
	ignore("nixl_buffer_device", kindString, nil, whyNIXL),
	refuse("gds_path", kindString, nil,
		"kvtier has no GPU Direct Storage tier: for a disk tier at that path, set local_disk to it and max_local_disk_size"),
	ignore("gds_path_sharding", kindString, "by_gpu", whyGDS),
	ignore("gds_buffer_size", kindInt, nil, whyGDS),
	refuse("maru_path", kindString, nil, "kvtier has no CXL shared-memory (Maru) tier"),
	ignore("maru_pool_size", kindFloat, 4.0, whyMaru),
	ignore("use_gds", kindBool, true, whyGDS),
	ignore("gds_backend", kindString, "cufile", whyGDS),
	ignore("audit_actual_remote_url", kindString, nil,
		"LMCache's remote audit mode, deprecated there too; kvtier checksums every remote object instead"),
	ignore("internal_api_server_host", kindString, "0.0.0.0", whyInternal),
	same("extra_config", kindMap, nil),
	same("save_unfull_chunk", kindBool, false),
	ignore("blocking_timeout_secs", kindInt, 10, "kvtier bounds each remote call by remote_timeout"),
	ignore("external_lookup_client", kindString, nil, "kvtier answers lookups from its own tiers"),
	ignore("py_enable_gc", kindBool, true, "a switch of Python's garbage collector; kvtier is not Python"),
	same("cache_policy", kindString, "LRU"),
	ignore("cost_aware_half_life_seconds", kindFloat, 60.0, whyCostAware),
	ignore("cost_aware_ewma_alpha", kindFloat, 0.2, whyCostAware),
	ignore("numa_mode", kindString, nil, "kvtier does not place the RAM tier by NUMA node"),
	ignore("enable_async_loading", kindBool, false,
		"how LMCache's connector schedules loads; kvtier's connector schedules its own"),
	ignore("internal_api_server_enabled", kindBool, false, whyInternal),
	ignore("internal_api_server_port_start", kindInt, 6999, whyInternal),
	ignore("priority_limit", kindInt, nil, "kvtier stores the KV of requests of every priority"),
	ignore("internal_api_server_include_index_list", kindInts, nil, whyInternal),
	ignore("internal_api_server_socket_path_prefix", kindString, nil, whyInternal),
	ignore("runtime_plugin_locations", kindStrings, nil, whyPlugins),
	refuse("storage_plugins", kindStrings, nil, whyStorePlug),
	refuse("remote_storage_plugins", kindStrings, nil, whyStorePlug),
	ignore("lookup_timeout_ms", kindInt, 3000, whyLookup),
	ignore("min_retrieve_tokens", kindInt, 0,
		"kvtier's connector loads every hit, however short; results are the same, only the recompute saved differs"),
	ignore("hit_miss_ratio", kindFloat, nil, "LMCache's test knob that caps the hit ratio; kvtier reports every hit"),
	ignore("lookup_server_worker_ids", kindInts, nil, whyLookup),
	ignore("enable_scheduler_bypass_lookup", kindBool, false, whyLookup),
	ignore("script_allowed_imports", kindStrings, nil, whyPlugins),
	ignore("enable_lazy_memory_allocator", kindBool, false, whyLazy),
	ignore("lazy_memory_initial_ratio", kindFloat, 0.2, whyLazy),
	ignore("lazy_memory_expand_trigger_ratio", kindFloat, 0.5, whyLazy),
	ignore("lazy_memory_step_ratio", kindFloat, 0.1, whyLazy),
	ignore("lazy_memory_safe_size", kindFloat, 0.0, whyLazy),
	ignore("enable_chunk_statistics", kindBool, false, whyStats),
	ignore("chunk_statistics_auto_start_statistics", kindBool, false, whyStats),
	ignore("chunk_statistics_auto_exit_timeout_hours", kindFloat, 0.0, whyStats),
	ignore("chunk_statistics_auto_exit_target_unique_chunks", kindInt, 0, whyStats),
	ignore("chunk_statistics_strategy", kindString, "memory_bloom_filter", whyStats),
	ignore("enable_kv_events", kindBool, false,
		"kvtier publishes KV events when kv_events_endpoint is set, with kv_events_pod, kv_events_model and kv_events_hash_seed"),
	ignore("use_gpu_connector_v3", kindBool, false, "picks one of LMCache's GPU connectors; kvtier's connector has one"),
	ignore("pin_timeout_sec", kindInt, 300, whyPin),
	ignore("pin_check_interval_sec", kindInt, 30, whyPin),
	refuse("remote_config_url", kindString, nil,
		"kvtier does not fetch configuration over the network: put the settings in the file"),
	ignore("app_id", kindString, nil, "sent only to remote_config_url, which kvtier refuses"),
	refuse("enable_hidden_state_cache", kindBool, false,
		"kvtier caches KV only, so hidden states would never be returned"),
	ignore("max_hidden_state_cpu_size", kindFloat, 2.0, whyHidden),
	ignore("hidden_state_layers", kindInts, nil, whyHidden),
	ignore("hidden_states_retrieve_mode", kindString, "prefix_strict", whyHidden),
}

// lmcacheAliases are the older names LMCache's _CONFIG_ALIASES maps onto
// current keys. kvtier treats each exactly as the key it names, so an old
// file asking for disaggregation by enable_xpyd is refused like enable_pd.
// nixl_buffer_size is both an alias of pd_buffer_size there and a key of its
// own; LMCache only renames aliases it also lists as deprecated, so it stays
// a key here.
var lmcacheAliases = map[string]string{
	"enable_xpyd":          "enable_pd",
	"nixl_peer_host":       "pd_peer_host",
	"nixl_peer_init_port":  "pd_peer_init_port",
	"nixl_peer_alloc_port": "pd_peer_alloc_port",
	"nixl_proxy_host":      "pd_proxy_host",
	"nixl_proxy_port":      "pd_proxy_port",
	"nixl_role":            "pd_role",
	"controller_url":       "controller_pull_url",
	"lmcache_worker_port":  "lmcache_worker_ports",
	"plugin_locations":     "runtime_plugin_locations",
	"external_backends":    "storage_plugins",
}

// lmcacheRetired are names LMCache still recognises only to warn that they
// are deprecated, then drops.
var lmcacheRetired = []lmcacheKey{
	ignore("nixl_peer_port", kindInt, nil, "deprecated in LMCache, which drops it too"),
}

// lmcacheIndex finds a row by LMCache name (aliases resolved by the caller).
var lmcacheIndex = indexLMCache()

func indexLMCache() map[string]*lmcacheKey {
	m := make(map[string]*lmcacheKey, len(lmcacheKeys)+len(lmcacheRetired))
	for i := range lmcacheKeys {
		m[lmcacheKeys[i].Name] = &lmcacheKeys[i]
	}
	for i := range lmcacheRetired {
		m[lmcacheRetired[i].Name] = &lmcacheRetired[i]
	}
	return m
}

// lmcacheSynonyms maps each mapped LMCache key to the kvtier key it sets.
func lmcacheSynonyms() map[string]string {
	m := map[string]string{}
	for _, k := range lmcacheKeys {
		if k.Disposition == mapped {
			m[k.Name] = k.Target
		}
	}
	return m
}

// isLMCacheName reports whether name is a key, alias or retired name of
// LMCache's configuration.
func isLMCacheName(name string) bool {
	if _, ok := lmcacheAliases[name]; ok {
		return true
	}
	_, ok := lmcacheIndex[name]
	return ok
}

// lmcacheNameList is every LMCache name, sorted, for typo suggestions on
// LMCACHE_ variables.
var lmcacheNameList = lmcacheNames()

func lmcacheNames() []string {
	var names []string
	for name := range lmcacheIndex {
		names = append(names, name)
	}
	for name := range lmcacheAliases {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// isDefault reports whether a decoded value leaves the key at LMCache's
// default. A missing value, an empty string and an empty list count as
// unset, as they do for LMCache's optional keys.
func (k *lmcacheKey) isDefault(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		if x == "" {
			return true
		}
	case []int64:
		return len(x) == 0 && k.Default == nil
	case []float64:
		return len(x) == 0 && k.Default == nil
	case []string:
		return len(x) == 0 && k.Default == nil
	case map[string]any:
		return len(x) == 0 && k.Default == nil
	}
	switch d := k.Default.(type) {
	case int:
		return v == int64(d)
	case float64:
		f, ok := v.(float64)
		return ok && f == d
	case nil:
		return false
	}
	return v == k.Default // bool or string: comparable
}

// showDefault renders LMCache's default as a YAML value for messages and
// for the documentation.
func (k *lmcacheKey) showDefault() string { return showValue(k.Default) }

// showValue renders a decoded value for a message: YAML-like, clipped, with
// secrets in URLs hidden.
func showValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return showFloat(x)
	case string:
		if strings.Contains(x, "://") {
			x = redactURL(x)
		}
		return strconv.Quote(clip(x))
	case []int64:
		return showList(len(x), func(i int) string { return strconv.FormatInt(x[i], 10) })
	case []float64:
		return showList(len(x), func(i int) string { return showFloat(x[i]) })
	case []string:
		return showList(len(x), func(i int) string { return showValue(x[i]) })
	case map[string]any:
		return "a mapping"
	}
	return "a value"
}

// showFloat writes floats as Python does (5.0, inf), since the defaults
// are LMCache's.
func showFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

func showList(n int, item func(int) string) string {
	const most = 8 // enough to recognise a list in a message
	parts := make([]string, 0, min(n, most+1))
	for i := range min(n, most) {
		parts = append(parts, item(i))
	}
	if n > most {
		parts = append(parts, "…")
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// check decides what a value of an ignored or refused key does: nothing at
// LMCache's default, a warning or an error otherwise.
func (k *lmcacheKey) check(v any) (*warning, error) {
	if k.Valid != nil && v != nil {
		if err := k.Valid(v); err != nil {
			return nil, err
		}
	}
	if k.isDefault(v) {
		return nil, nil
	}
	if k.Disposition == refused {
		return nil, fmt.Errorf("%w (%s); remove it or set it to %s", ErrUnsupported, k.Reason, k.showDefault())
	}
	return &warning{Value: showValue(v), Reason: k.Reason}, nil
}

// whyEC explains the encoder-cache overrides: LMCache builds a second
// engine for multimodal encoder outputs from ec_<key> entries (or an ec:
// mapping) layered over the main configuration. kvtier has no such engine.
const whyEC = "an override for LMCache's encoder-cache (EC) engine, which kvtier does not have"

// ecOverride handles the key ec and keys ec_<LMCache key>. decode reads
// the value as the kind it is given. handled is false for any other key.
func ecOverride(key string, decode func(valueKind) (any, error)) (w *warning, handled bool, err error) {
	kind := kindMap
	if key != "ec" {
		rest, ok := strings.CutPrefix(key, "ec_")
		k, known := lmcacheIndex[lmcacheName(rest)]
		if !ok || !known {
			return nil, false, nil
		}
		kind = k.Kind
	}
	v, err := decode(kind)
	if err != nil || v == nil {
		return nil, true, err
	}
	return &warning{Value: showValue(v), Reason: whyEC}, true, nil
}

// lmcacheName resolves an LMCache alias to the key it stands for.
func lmcacheName(name string) string {
	if a, ok := lmcacheAliases[name]; ok {
		return a
	}
	return name
}

// isLMCacheVar reports whether an LMCACHE_ variable names a key kvtier
// should read: an LMCache key, alias or retired name, or an EC override of
// one. LMCache uses the same prefix for settings outside its configuration
// (LMCACHE_LOG_LEVEL, LMCACHE_CONFIG_FILE, …), which are left alone.
func isLMCacheVar(key string) bool {
	if rest, ok := strings.CutPrefix(key, "ec_"); ok {
		key = rest
	}
	return isLMCacheName(key)
}
