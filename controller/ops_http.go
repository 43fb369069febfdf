package controller

import (
	"errors"
	"net/http"
	"strings"

	"kvtier/cluster"
)

// ServeHTTP serves the operations API (docs/cluster.md, "Cluster
// operations"): POST /v1/cluster/ops starts one, GET /v1/cluster/ops
// lists the recent ones, GET /v1/cluster/ops/{id} reports one.
func (t *opTracker) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	id, one := strings.CutPrefix(req.URL.Path, "/v1/cluster/ops/")
	switch {
	case req.URL.Path == "/v1/cluster/ops" && req.Method == http.MethodPost:
		t.serveStart(w, req)
	case req.URL.Path == "/v1/cluster/ops" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, cluster.OpList{Ops: t.list()})
	case req.URL.Path == "/v1/cluster/ops":
		w.Header().Set("Allow", "GET, POST")
		httpError(w, http.StatusMethodNotAllowed, errors.New("want GET or POST"))
	case !one || id == "" || strings.Contains(id, "/"):
		httpError(w, http.StatusNotFound, errors.New("no such cluster endpoint"))
	case req.Method != http.MethodGet:
		w.Header().Set("Allow", "GET")
		httpError(w, http.StatusMethodNotAllowed, errors.New("want GET"))
	default:
		op, ok := t.get(id)
		if !ok {
			httpError(w, http.StatusNotFound, errors.New("no such operation (the controller remembers the last 256, since it started)"))
			return
		}
		writeJSON(w, http.StatusOK, op)
	}
}

func (t *opTracker) serveStart(w http.ResponseWriter, req *http.Request) {
	var r cluster.OpRequest
	if err := cluster.Decode(req.Body, cluster.MaxOpBodyBytes, &r); err != nil {
		decodeError(w, err)
		return
	}
	id, err := t.start(r)
	switch {
	case errors.Is(err, errOpsBusy):
		httpError(w, http.StatusTooManyRequests, err)
	case errors.Is(err, errRegistryDown):
		httpError(w, http.StatusServiceUnavailable, err)
	case err != nil:
		httpError(w, http.StatusBadRequest, err)
	default:
		w.Header().Set("Location", "/v1/cluster/ops/"+id)
		writeJSON(w, http.StatusAccepted, cluster.OpStarted{ID: id})
	}
}
