package controller

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"kvtier/cluster"
	"kvtier/router/index"
)

// ServeHTTP serves the registry API under /v1/cluster/ (docs/cluster.md).
func (r *registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch {
	case req.URL.Path == "/v1/cluster/instances" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"instances": r.instances()})
	case req.Method != http.MethodPost:
		httpError(w, http.StatusMethodNotAllowed, errors.New("want POST (or GET /v1/cluster/instances)"))
	case req.URL.Path == "/v1/cluster/register":
		r.serveRegister(w, req)
	case req.URL.Path == "/v1/cluster/heartbeat":
		r.serveBeat(w, req, false)
	case req.URL.Path == "/v1/cluster/deregister":
		r.serveBeat(w, req, true)
	case req.URL.Path == "/v1/cluster/lookup":
		r.serveLookup(w, req)
	default:
		httpError(w, http.StatusNotFound, errors.New("no such cluster endpoint"))
	}
}

func (r *registry) serveRegister(w http.ResponseWriter, req *http.Request) {
	var reg cluster.Register
	if err := cluster.Decode(req.Body, cluster.MaxBodyBytes, &reg); err != nil {
		decodeError(w, err)
		return
	}
	out, err := r.register(reg)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// serveBeat answers a heartbeat or a deregistration: 404 for a session
// the registry does not know, which tells the daemon to register again.
func (r *registry) serveBeat(w http.ResponseWriter, req *http.Request, leave bool) {
	var hb cluster.Heartbeat
	if err := cluster.Decode(req.Body, cluster.MaxBodyBytes, &hb); err != nil {
		decodeError(w, err)
		return
	}
	var ok bool
	if leave {
		ok = hb.Session != "" && r.drop(hb.Instance, hb.Session, "deregistered")
	} else {
		ok = r.beat(hb.Instance, hb.Session)
	}
	if !ok {
		httpError(w, http.StatusNotFound, errors.New("unknown instance or session: register again"))
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// lookupScratch is one lookup's reusable memory.
type lookupScratch struct {
	req   cluster.LookupRequest
	keys  []uint64
	words []uint32
	seen  []index.PodID // daemons in reply order
	out   []byte
}

func (r *registry) serveLookup(w http.ResponseWriter, req *http.Request) {
	sc := r.lookups.Get().(*lookupScratch)
	defer r.lookups.Put(sc)
	sc.req.Keys = sc.req.Keys[:0]
	if err := cluster.Decode(req.Body, cluster.MaxLookupBodyBytes, &sc.req); err != nil {
		decodeError(w, err)
		return
	}
	if len(sc.req.Keys) > cluster.MaxLookupKeys {
		httpError(w, http.StatusRequestEntityTooLarge, errors.New("more than "+strconv.Itoa(cluster.MaxLookupKeys)+" keys"))
		return
	}
	sc.keys = sc.keys[:0]
	for _, k := range sc.req.Keys {
		sc.keys = append(sc.keys, uint64(k))
	}
	sc.out = r.appendLookup(sc.out[:0], sc)
	w.Header().Set("Content-Type", "application/json")
	w.Write(sc.out)
}

// appendLookup appends the JSON LookupReply for sc.keys to dst. It is the
// lookup's work apart from reading the request, and allocates nothing
// once sc is warm: holders are read as packed words, one per pod.
func (r *registry) appendLookup(dst []byte, sc *lookupScratch) []byte {
	table := *r.daemons.Load()
	ix := r.reader(sc.keys)
	sc.seen = sc.seen[:0]
	dst = append(dst, `{"holders":[`...)
	for i, k := range sc.keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '[')
		sc.words = ix.HolderWords(k, sc.words[:0])
		n := 0
		for _, w := range sc.words {
			pod, tiers := index.HolderOf(w)
			if int(pod) >= len(table) || table[pod] == nil {
				continue // a vLLM pod, or a daemon being dropped
			}
			d := seenIndex(&sc.seen, pod)
			for t := index.Tier(0); t < index.NumTiers; t++ {
				if tiers&(1<<t) == 0 {
					continue
				}
				if n > 0 {
					dst = append(dst, ',')
				}
				n++
				dst = append(dst, `{"daemon":`...)
				dst = strconv.AppendInt(dst, int64(d), 10)
				dst = append(dst, `,"tier":"`...)
				dst = append(dst, tierNames[t]...)
				dst = append(dst, `"}`...)
			}
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `],"daemons":[`...)
	for i, id := range sc.seen {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, table[id].json...)
	}
	return append(dst, "]}\n"...)
}

// tierNames are the index tiers as lookups name them.
var tierNames = [index.NumTiers]string{index.GPU: "gpu", index.CPU: "cpu", index.Disk: "disk", index.Remote: "remote"}

// seenIndex returns id's position in seen, appending it if new. A lookup
// names few daemons, so a scan beats a map.
func seenIndex(seen *[]index.PodID, id index.PodID) int {
	for i, s := range *seen {
		if s == id {
			return i
		}
	}
	*seen = append(*seen, id)
	return len(*seen) - 1
}

func appendDaemonJSON(dst []byte, instance, addr string) []byte {
	b, _ := json.Marshal(cluster.Daemon{Instance: instance, Addr: addr})
	return append(dst, b...)
}

func decodeError(w http.ResponseWriter, err error) {
	if errors.Is(err, cluster.ErrTooLarge) {
		httpError(w, http.StatusRequestEntityTooLarge, err)
		return
	}
	httpError(w, http.StatusBadRequest, err)
}

func httpError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
