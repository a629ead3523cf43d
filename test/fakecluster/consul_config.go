package fakecluster

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The config entry kinds the fake stores; it refuses the others rather
// than pretend to apply them.
const (
	kindServiceDefaults = "service-defaults"
	kindRouter          = "service-router"
	kindSplitter        = "service-splitter"
	kindResolver        = "service-resolver"
)

type configEntry struct {
	raw                      map[string]any // as written, without the indexes
	createIndex, modifyIndex uint64
}

func (e *configEntry) wire() map[string]any {
	out := maps.Clone(e.raw)
	out["CreateIndex"], out["ModifyIndex"] = e.createIndex, e.modifyIndex
	return out
}

// configState is the entries by kind and name, as a chain compiles from.
type configState map[string]map[string]map[string]any

func (c *Consul) configStateLocked() configState {
	out := configState{}
	for kind, byName := range c.config {
		out[kind] = map[string]map[string]any{}
		for n, e := range byName {
			out[kind][n] = e.raw
		}
	}
	return out
}

// configWrite checks a write of an entry (raw nil: its deletion) as Consul
// does: cas, then the routing graph with the change in place (every chain
// must still compile; validateProposedConfigEntryInGraph). It answers false
// for a cas mismatch.
func (c *Consul) configWrite(w http.ResponseWriter, r *http.Request, kind, name string, raw map[string]any) {
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	cur := c.config[kind][name]
	if v := r.URL.Query().Get("cas"); v != "" {
		n, _ := strconv.ParseUint(v, 10, 64)
		if n == 0 && cur != nil || n != 0 && (cur == nil || cur.modifyIndex != n) {
			writeJSON(w, writeHeaders, false)
			return
		}
	}
	proposed := c.configStateLocked()
	if proposed[kind] == nil {
		proposed[kind] = map[string]map[string]any{}
	}
	proposed[kind][name] = raw
	if raw == nil {
		delete(proposed[kind], name)
	}
	for _, k := range []string{kindRouter, kindSplitter, kindResolver} {
		for _, n := range slices.Sorted(maps.Keys(proposed[k])) {
			if _, err := proposed.compile(n); err != nil {
				writeText(w, writeHeaders, http.StatusInternalServerError, err.Error())
				return
			}
		}
	}
	if raw == nil {
		if cur != nil {
			c.configIndex = c.nextIndex()
			delete(c.config[kind], name)
		}
		writeJSON(w, writeHeaders, map[string]any{})
		return
	}
	e := &configEntry{raw: raw, createIndex: c.nextIndex()}
	e.modifyIndex, c.configIndex = e.createIndex, e.createIndex
	if cur != nil {
		e.createIndex = cur.createIndex
	}
	if c.config[kind] == nil {
		c.config[kind] = map[string]*configEntry{}
	}
	c.config[kind][name] = e
	writeJSON(w, writeHeaders, true)
}

// configSet is PUT /v1/config: the entry's own validation, then configWrite.
func (c *Consul) configSet(w http.ResponseWriter, r *http.Request) {
	var raw map[string]any
	if err := readJSON(r, &raw); err != nil {
		badRequest(w, err)
		return
	}
	delete(raw, "CreateIndex")
	delete(raw, "ModifyIndex")
	kind, _ := raw["Kind"].(string)
	name, _ := raw["Name"].(string)
	kind = strings.ToLower(kind)
	raw["Kind"] = kind
	if err := validateEntry(kind, name, raw); err != nil {
		writeText(w, writeHeaders, http.StatusInternalServerError, err.Error())
		return
	}
	c.configWrite(w, r, kind, name, raw)
}

func (c *Consul) configDelete(w http.ResponseWriter, r *http.Request) {
	kind := strings.ToLower(r.PathValue("kind"))
	if err := validateEntry(kind, r.PathValue("name"), nil); err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, err.Error())
		return
	}
	c.configWrite(w, r, kind, r.PathValue("name"), nil)
}

func (c *Consul) configGet(w http.ResponseWriter, r *http.Request) {
	kind, name := strings.ToLower(r.PathValue("kind")), r.PathValue("name")
	e, idx := block(r, &c.changed, c.quit, func() (map[string]any, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if e := c.config[kind][name]; e != nil {
			return e.wire(), c.configIndex
		}
		return nil, c.configIndex
	})
	if e == nil {
		writeText(w, readHeaders(idx), http.StatusNotFound, fmt.Sprintf("Config entry not found for %q / %q", kind, name))
		return
	}
	writeJSON(w, readHeaders(idx), e)
}

func (c *Consul) configList(w http.ResponseWriter, r *http.Request) {
	kind := strings.ToLower(r.PathValue("kind"))
	list, idx := block(r, &c.changed, c.quit, func() ([]map[string]any, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []map[string]any{}
		for _, n := range slices.Sorted(maps.Keys(c.config[kind])) {
			out = append(out, c.config[kind][n].wire())
		}
		return out, c.configIndex
	})
	writeJSON(w, readHeaders(idx), list)
}

// ConfigEntries lists the names of the stored entries of a kind, sorted.
func (c *Consul) ConfigEntries(kind string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.config[kind]))
}

// ConfigEntry returns a stored entry as Consul would answer it, or nil.
func (c *Consul) ConfigEntry(kind, name string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.config[kind][name]; e != nil {
		return e.wire()
	}
	return nil
}

// validateEntry is an entry's own validation (Consul's Validate methods)
// for what routing needs; raw nil checks the kind and name only.
func validateEntry(kind, name string, raw map[string]any) error {
	switch {
	case kind == "":
		return fmt.Errorf("Request decoding failed: Payload does not contain a Kind key at the top level")
	case !slices.Contains([]string{kindServiceDefaults, kindRouter, kindSplitter, kindResolver}, kind):
		return fmt.Errorf("fake cluster: config entry kind %q is not supported by the fake Consul", kind)
	case name == "":
		return fmt.Errorf("Name is required")
	case raw == nil:
		return nil
	case kind == kindSplitter:
		splits, _ := raw["Splits"].([]any)
		if len(splits) == 0 {
			return fmt.Errorf("no splits configured")
		}
		sum := 0.0
		for _, s := range splits {
			m, _ := s.(map[string]any)
			wt, _ := m["Weight"].(float64)
			if wt < 0 {
				return fmt.Errorf("split weight %f is negative", wt)
			}
			sum += wt
		}
		if math.Abs(sum*100-10000) > 0.5 { // Consul compares hundredths of a percent
			return fmt.Errorf("the sum of all split weights must be 100, not %f", sum)
		}
	case kind == kindServiceDefaults:
		if p, _ := raw["Protocol"].(string); p != "" && !slices.Contains([]string{"tcp", "http", "http2", "grpc"}, strings.ToLower(p)) {
			return fmt.Errorf("protocol %q is not supported", p)
		}
	}
	return nil
}

// protocolOf is a service's protocol: its service-defaults', else tcp.
func (s configState) protocolOf(service string) string {
	p, _ := s[kindServiceDefaults][service]["Protocol"].(string)
	return strings.ToLower(cmp.Or(p, "tcp"))
}

// chain is a compiled discovery chain in Consul's wire shape (fixture 037).
type chain struct {
	ServiceName      string
	Namespace        string
	Partition        string
	Datacenter       string
	Protocol         string
	StartNode        string
	Default          bool `json:",omitempty"`
	Nodes            map[string]map[string]any
	Targets          map[string]map[string]any
	AutoVirtualIPs   []string
	ManualVirtualIPs []string
}

// compile builds a service's discovery chain, checking what Consul checks:
// one protocol across every service the chain reaches (failover targets
// included), and an L7 protocol when it routes or splits.
func (s configState) compile(service string) (*chain, error) {
	ch := &chain{ServiceName: service, Namespace: "default", Partition: "default", Datacenter: consulDC,
		Nodes: map[string]map[string]any{}, Targets: map[string]map[string]any{}, AutoVirtualIPs: []string{"240.0.0.1"}, ManualVirtualIPs: []string{}}
	var err error
	record := func(svc string) {
		if p := s.protocolOf(svc); ch.Protocol == "" {
			ch.Protocol = p
		} else if ch.Protocol != p && err == nil {
			err = fmt.Errorf("discovery chain %q uses inconsistent protocols; service %q has %q which is not %q", service, svc, p, ch.Protocol)
		}
	}
	target := func(svc string, timeout time.Duration) string {
		id := svc + ".default.default." + consulDC
		sni := svc + ".default." + consulDC + ".internal.98553649-c29e-c0d2-7968-cf32fefd4375.consul" // the CA's trust domain
		if ch.Targets[id] == nil {
			ch.Targets[id] = map[string]any{"ID": id, "Service": svc, "Namespace": "default", "Partition": "default", "Datacenter": consulDC,
				"ConnectTimeout": timeout.String(), "MeshGateway": map[string]any{}, "Subset": map[string]any{},
				"TransparentProxy": map[string]any{}, "SNI": sni, "Name": sni}
		}
		return id
	}
	resolver := func(svc string) string {
		record(svc)
		node := "resolver:" + svc + ".default.default." + consulDC
		if ch.Nodes[node] != nil {
			return node
		}
		entry := s[kindResolver][svc]
		timeout := 5 * time.Second
		if d, e := time.ParseDuration(fmt.Sprint(entry["ConnectTimeout"])); e == nil && d > 0 {
			timeout = d
		}
		res := map[string]any{"ConnectTimeout": timeout.String(), "Target": target(svc, timeout)}
		if entry == nil {
			res["Default"] = true
		}
		fo, _ := entry["Failover"].(map[string]any)
		star, _ := fo["*"].(map[string]any)
		targets, _ := star["Targets"].([]any)
		if one, _ := star["Service"].(string); one != "" {
			targets = append([]any{map[string]any{"Service": one}}, targets...)
		}
		var failover []string
		for _, t := range targets {
			if m, _ := t.(map[string]any); m["Service"] != nil {
				f := fmt.Sprint(m["Service"])
				record(f)
				failover = append(failover, target(f, 5*time.Second))
			}
		}
		if len(failover) > 0 {
			res["Failover"] = map[string]any{"Targets": failover}
		}
		ch.Nodes[node] = map[string]any{"Type": "resolver", "Name": svc + ".default.default." + consulDC, "Resolver": res}
		return node
	}
	// next is where a request for svc goes: its splitter if it has one,
	// else its resolver.
	var next func(svc string, splitter bool) string
	next = func(svc string, splitter bool) string {
		node := "splitter:" + svc + ".default.default"
		if !splitter || s[kindSplitter][svc] == nil {
			return resolver(svc)
		}
		if ch.Nodes[node] != nil {
			return node
		}
		record(svc)
		ch.Nodes[node] = map[string]any{"Type": "splitter", "Name": svc + ".default.default"} // against cycles
		var splits []map[string]any
		list, _ := s[kindSplitter][svc]["Splits"].([]any)
		for _, sp := range list {
			m, _ := sp.(map[string]any)
			to, _ := m["Service"].(string)
			if to == "" {
				to = svc
			}
			wt, _ := m["Weight"].(float64)
			splits = append(splits, map[string]any{"Definition": m, "Weight": wt, "NextNode": next(to, to != svc)})
		}
		ch.Nodes[node]["Splits"] = splits
		return node
	}

	record(service)
	router := s[kindRouter][service]
	advanced := router != nil || s[kindSplitter][service] != nil
	if router == nil {
		ch.StartNode = next(service, true)
		ch.Default = !advanced && s[kindResolver][service] == nil
	} else {
		var routes []map[string]any
		list, _ := router["Routes"].([]any)
		for _, rt := range list {
			m, _ := rt.(map[string]any)
			d, _ := m["Destination"].(map[string]any)
			dest, _ := d["Service"].(string)
			if dest == "" {
				dest = service
			}
			routes = append(routes, map[string]any{"Definition": m, "NextNode": next(dest, true)})
		}
		routes = append(routes, map[string]any{"NextNode": next(service, true), "Definition": map[string]any{
			"Match":       map[string]any{"HTTP": map[string]any{"PathPrefix": "/"}},
			"Destination": map[string]any{"Service": service, "Namespace": "default", "Partition": "default"},
		}})
		ch.StartNode = "router:" + service + ".default.default"
		ch.Nodes[ch.StartNode] = map[string]any{"Type": "router", "Name": service + ".default.default", "Routes": routes}
	}
	if err == nil && advanced && !slices.Contains([]string{"http", "http2", "grpc"}, ch.Protocol) {
		err = fmt.Errorf("discovery chain %q uses a protocol %q that does not permit advanced routing or splitting behavior", service, ch.Protocol)
	}
	return ch, err
}

func (c *Consul) discoveryChain(w http.ResponseWriter, r *http.Request) {
	type result struct {
		ch  *chain
		err error
	}
	res, idx := block(r, &c.changed, c.quit, func() (result, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		ch, err := c.configStateLocked().compile(r.PathValue("name"))
		return result{ch, err}, c.configIndex
	})
	if res.err != nil {
		writeText(w, readHeaders(idx), http.StatusInternalServerError, res.err.Error())
		return
	}
	writeJSON(w, readHeaders(idx), map[string]any{"Chain": res.ch})
}
