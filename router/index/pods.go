package index

import (
	"errors"
	"fmt"
	"sync"
)

// PodID is the interned, small identifier of a serving pod. The index stores
// PodIDs rather than names so that an entry costs a few bytes.
type PodID uint16

// MaxPods is the number of distinct PodIDs a Pods registry can hand out.
const MaxPods = 1 << 16

// ErrPodsExhausted is returned by Pods.Intern when every PodID is in use.
var ErrPodsExhausted = errors.New("index: all pod ids in use")

// ErrEmptyPodName is returned by Pods.Intern for the empty name.
var ErrEmptyPodName = errors.New("index: empty pod name")

// Pods interns pod names as PodIDs. Ids of removed pods are reused, so a
// caller must clear a pod from every Index (Index.ClearPod) before removing
// it here; otherwise a new pod would inherit the old one's blocks.
type Pods struct {
	mu     sync.RWMutex
	ids    map[string]PodID
	names  []string // by PodID; "" marks a free id
	models []string // by PodID: the model the pod serves, "" if unknown
	free   []PodID
}

// NewPods returns an empty registry.
func NewPods() *Pods {
	return &Pods{ids: make(map[string]PodID)}
}

// Intern returns the id of name, assigning a new one if name is unknown.
func (p *Pods) Intern(name string) (PodID, error) {
	if name == "" {
		return 0, ErrEmptyPodName
	}
	p.mu.RLock()
	id, ok := p.ids[name]
	p.mu.RUnlock()
	if ok {
		return id, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.ids[name]; ok {
		return id, nil
	}
	switch {
	case len(p.free) > 0:
		id = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.names[id], p.models[id] = name, ""
	case len(p.names) < MaxPods:
		id = PodID(len(p.names))
		p.names = append(p.names, name)
		p.models = append(p.models, "")
	default:
		return 0, fmt.Errorf("interning pod %q: %w", name, ErrPodsExhausted)
	}
	p.ids[name] = id
	return id, nil
}

// ID returns the id of name if it is registered.
func (p *Pods) ID(name string) (PodID, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	id, ok := p.ids[name]
	return id, ok
}

// Name returns the name registered for id.
func (p *Pods) Name(id PodID) (string, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if int(id) >= len(p.names) || p.names[id] == "" {
		return "", false
	}
	return p.names[id], true
}

// Remove unregisters name and makes its id reusable. It reports the id the
// pod had and whether it was registered.
func (p *Pods) Remove(name string) (PodID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.ids[name]
	if !ok {
		return 0, false
	}
	delete(p.ids, name)
	p.names[id], p.models[id] = "", ""
	p.free = append(p.free, id)
	return id, true
}

// Len returns the number of registered pods.
func (p *Pods) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.ids)
}

// SetModel records the model pod id serves (from its KV-event topic or its
// configuration). Scoring for a model then skips pods known to serve
// another one: vLLM's block hashes do not include the model, so the same
// prompt hashes alike on every model.
func (p *Pods) SetModel(id PodID, model string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(id) < len(p.models) && p.names[id] != "" {
		p.models[id] = model
	}
}

// Model returns the model recorded for id, "" if none.
func (p *Pods) Model(id PodID) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if int(id) >= len(p.models) {
		return ""
	}
	return p.models[id]
}

// ServingModel appends to dst the pods that serve model, or whose model is
// unknown, and returns the extended slice and whether any pod had a model
// recorded at all.
func (p *Pods) ServingModel(model string, dst []PodID) ([]PodID, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	known := false
	for id, name := range p.names {
		if name == "" {
			continue
		}
		m := p.models[id]
		known = known || m != ""
		if m == "" || m == model {
			dst = append(dst, PodID(id))
		}
	}
	return dst, known
}
