package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"kvtier/admin"
	"kvtier/config"
	"kvtier/server"
)

func getJSON(t *testing.T, h http.Handler, url string, v any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", url, nil)
	req.Host = "localhost" // without admin_token the admin API answers loopback names only
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusOK && v != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	return rec.Code
}

func TestKeysAndScopesAPI(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	adm, err := admin.New(d.eng, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := adm.Handler()
	c := d.local(t)
	handle, _ := c.Scope(context.Background(), pScope)
	storeLocal(t, c, handle, prompt(3*pChunkTokens, 21), 21)

	var scopes []admin.ScopeInfo
	if code := getJSON(t, h, "/api/v1/scopes", &scopes); code != 200 || len(scopes) != 1 {
		t.Fatalf("scopes: %d %+v", code, scopes)
	}
	if s := scopes[0]; s.Model != pScope.Model || s.Format != pScope.Format || s.Chunks["mem"] != 3 || s.Bytes["mem"] != 3*pChunkBytes {
		t.Errorf("scope entry %+v", s)
	}
	var keys admin.KeyList
	if code := getJSON(t, h, "/api/v1/keys?model="+pScope.Model, &keys); code != 200 || len(keys.Keys) != 3 || keys.Truncated {
		t.Fatalf("keys by model: %d %+v", code, keys)
	}
	first := keys.Keys[0]
	if first.Scope != scopes[0].ID || first.Tier != "mem" || first.Bytes != pChunkBytes || len(first.Hash) != 32 {
		t.Errorf("key entry %+v", first)
	}
	var one admin.KeyList
	getJSON(t, h, "/api/v1/keys?scope="+first.Scope+"&prefix="+first.Hash[:6], &one)
	if len(one.Keys) != 1 || one.Keys[0].Hash != first.Hash {
		t.Errorf("prefix filter: %+v", one)
	}
	var limited admin.KeyList
	getJSON(t, h, "/api/v1/keys?limit=2", &limited)
	if len(limited.Keys) != 2 || !limited.Truncated {
		t.Errorf("limit: %+v", limited)
	}
	for _, bad := range []string{"?limit=0", "?limit=x", "?prefix=zz", "?scope=nothex", "?scope=1&model=m", "?model=unknown"} {
		if code := getJSON(t, h, "/api/v1/keys"+bad, nil); code != http.StatusBadRequest {
			t.Errorf("/api/v1/keys%s: %d, want 400", bad, code)
		}
	}
}
