package fakecluster

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config entry kinds the fake Consul stores. Consul has more; the fake
// refuses the others rather than pretend to apply them.
const (
	kindServiceDefaults = "service-defaults"
	kindProxyDefaults   = "proxy-defaults"
	kindRouter          = "service-router"
	kindSplitter        = "service-splitter"
	kindResolver        = "service-resolver"
)

var supportedKinds = map[string]bool{
	kindServiceDefaults: true, kindProxyDefaults: true, kindRouter: true, kindSplitter: true, kindResolver: true,
}

type configEntry struct {
	Kind        string
	Name        string
	raw         map[string]any // as written, without the indexes
	CreateIndex uint64
	ModifyIndex uint64
}

func (e *configEntry) wire() map[string]any {
	out := make(map[string]any, len(e.raw)+2)
	for k, v := range e.raw {
		out[k] = v
	}
	out["CreateIndex"] = e.CreateIndex
	out["ModifyIndex"] = e.ModifyIndex
	return out
}

// configSet is PUT /v1/config: validate the entry on its own, then the
// routing graph with it in place (as Consul's
// validateProposedConfigEntryInGraph does), then store it.
func (c *Consul) configSet(w http.ResponseWriter, r *http.Request) {
	var raw map[string]any
	if !decodeJSON(w, r, &raw) {
		return
	}
	delete(raw, "CreateIndex")
	delete(raw, "ModifyIndex")
	kind, _ := raw["Kind"].(string)
	name, _ := raw["Name"].(string)
	kind = strings.ToLower(kind)
	switch {
	case kind == "":
		writeText(w, writeHeaders, http.StatusBadRequest, "Request decoding failed: Payload does not contain a Kind key at the top level")
		return
	case !supportedKinds[kind]:
		writeText(w, writeHeaders, http.StatusBadRequest, fmt.Sprintf("fake cluster: config entry kind %q is not supported by the fake Consul", kind))
		return
	case name == "":
		writeText(w, writeHeaders, http.StatusInternalServerError, "Name is required")
		return
	}
	raw["Kind"] = kind
	if err := validateEntry(kind, name, raw); err != nil {
		writeText(w, writeHeaders, http.StatusInternalServerError, err.Error())
		return
	}
	var cas *uint64
	if v := r.URL.Query().Get("cas"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, "Invalid cas index: "+err.Error())
			return
		}
		cas = &n
	}

	c.mu.Lock()
	cur := c.config[kind][name]
	if cas != nil && ((*cas == 0 && cur != nil) || (*cas != 0 && (cur == nil || cur.ModifyIndex != *cas))) {
		c.mu.Unlock()
		writeJSON(w, writeHeaders, false)
		return
	}
	proposed := c.configSnapshotLocked()
	proposed.set(kind, name, raw)
	if err := proposed.validateGraph(); err != nil {
		c.mu.Unlock()
		writeText(w, writeHeaders, http.StatusInternalServerError, err.Error())
		return
	}
	idx := c.nextIndex()
	if c.config[kind] == nil {
		c.config[kind] = map[string]*configEntry{}
	}
	e := &configEntry{Kind: kind, Name: name, raw: raw, CreateIndex: idx, ModifyIndex: idx}
	if cur != nil {
		e.CreateIndex = cur.CreateIndex
	}
	c.config[kind][name] = e
	c.configIndex = idx
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, writeHeaders, true)
}

func (c *Consul) configGet(w http.ResponseWriter, r *http.Request) {
	kind, name := strings.ToLower(r.PathValue("kind")), r.PathValue("name")
	e, idx := block(r, &c.changed, c.quit, func() (*configEntry, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.config[kind][name], c.configIndex
	})
	if e == nil {
		writeText(w, readHeaders(idx), http.StatusNotFound, fmt.Sprintf("Config entry not found for %q / %q", kind, name))
		return
	}
	writeJSON(w, readHeaders(idx), e.wire())
}

func (c *Consul) configList(w http.ResponseWriter, r *http.Request) {
	kind := strings.ToLower(r.PathValue("kind"))
	list, idx := block(r, &c.changed, c.quit, func() ([]map[string]any, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		names := make([]string, 0, len(c.config[kind]))
		for n := range c.config[kind] {
			names = append(names, n)
		}
		sort.Strings(names)
		out := make([]map[string]any, 0, len(names))
		for _, n := range names {
			out = append(out, c.config[kind][n].wire())
		}
		return out, c.configIndex
	})
	writeJSON(w, readHeaders(idx), list)
}

func (c *Consul) configDelete(w http.ResponseWriter, r *http.Request) {
	kind, name := strings.ToLower(r.PathValue("kind")), r.PathValue("name")
	if !supportedKinds[kind] {
		writeText(w, writeHeaders, http.StatusBadRequest, fmt.Sprintf("fake cluster: config entry kind %q is not supported by the fake Consul", kind))
		return
	}
	c.mu.Lock()
	cur := c.config[kind][name]
	if v := r.URL.Query().Get("cas"); v != "" {
		n, _ := strconv.ParseUint(v, 10, 64)
		if cur == nil || cur.ModifyIndex != n {
			c.mu.Unlock()
			writeJSON(w, writeHeaders, false)
			return
		}
	}
	if cur == nil {
		// Deleting an absent entry succeeds.
		c.mu.Unlock()
		writeJSON(w, writeHeaders, map[string]any{})
		return
	}
	proposed := c.configSnapshotLocked()
	proposed.remove(kind, name)
	if err := proposed.validateGraph(); err != nil {
		c.mu.Unlock()
		writeText(w, writeHeaders, http.StatusInternalServerError, err.Error())
		return
	}
	idx := c.nextIndex()
	delete(c.config[kind], name)
	c.configIndex = idx
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, writeHeaders, map[string]any{})
}

// ConfigEntries lists the names of the stored entries of a kind, sorted.
func (c *Consul) ConfigEntries(kind string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.config[kind] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
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

// validateEntry is the entry's own validation (Consul's Validate methods),
// for the parts that matter to routing.
func validateEntry(kind, name string, raw map[string]any) error {
	switch kind {
	case kindProxyDefaults:
		if name != "global" {
			return fmt.Errorf("invalid name (%q), only %q is supported", name, "global")
		}
	case kindSplitter:
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
		// Consul compares in hundredths of a percent.
		if math.Abs(sum*100-10000) > 0.5 {
			return fmt.Errorf("the sum of all split weights must be 100, not %f", sum)
		}
	case kindServiceDefaults:
		if p, ok := raw["Protocol"].(string); ok && p != "" {
			switch strings.ToLower(p) {
			case "tcp", "http", "http2", "grpc":
			default:
				return fmt.Errorf("protocol %q is not supported", p)
			}
		}
	case kindResolver:
		if v, ok := raw["ConnectTimeout"]; ok {
			if _, err := parseConsulDuration(v); err != nil {
				return fmt.Errorf("ConnectTimeout: %v", err)
			}
		}
	}
	return nil
}

// configState is a copy of the entries a discovery chain is compiled from.
type configState map[string]map[string]map[string]any // kind -> name -> raw

func (c *Consul) configSnapshotLocked() configState {
	out := configState{}
	for kind, byName := range c.config {
		out[kind] = map[string]map[string]any{}
		for n, e := range byName {
			out[kind][n] = e.raw
		}
	}
	return out
}

func (s configState) set(kind, name string, raw map[string]any) {
	if s[kind] == nil {
		s[kind] = map[string]map[string]any{}
	}
	s[kind][name] = raw
}

func (s configState) remove(kind, name string) { delete(s[kind], name) }

// validateGraph compiles the chain of every service that has a router,
// splitter or resolver; Consul refuses a write that would leave any of them
// uncompilable.
func (s configState) validateGraph() error {
	names := map[string]bool{}
	for _, kind := range []string{kindRouter, kindSplitter, kindResolver} {
		for n := range s[kind] {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		if _, err := s.compile(n); err != nil {
			return err
		}
	}
	return nil
}

func (s configState) protocolOf(service string) string {
	if d := s[kindServiceDefaults][service]; d != nil {
		if p, _ := d["Protocol"].(string); p != "" {
			return strings.ToLower(p)
		}
	}
	if g := s[kindProxyDefaults]["global"]; g != nil {
		if cfg, ok := g["Config"].(map[string]any); ok {
			if p, _ := cfg["protocol"].(string); p != "" {
				return strings.ToLower(p)
			}
		}
	}
	return "tcp"
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

// fakeTrustDomain stands in for the cluster's CA trust domain in SNI names.
const fakeTrustDomain = "98553649-c29e-c0d2-7968-cf32fefd4375.consul"

func targetID(service string) string { return service + ".default.default." + consulDC }

// compile builds service's discovery chain from the entries, checking what
// Consul checks: one protocol across every service the chain reaches
// (failover targets included), and an L7 protocol when it routes or splits.
func (s configState) compile(service string) (*chain, error) {
	ch := &chain{ServiceName: service, Namespace: "default", Partition: "default", Datacenter: consulDC,
		Nodes: map[string]map[string]any{}, Targets: map[string]map[string]any{},
		AutoVirtualIPs: []string{"240.0.0.1"}, ManualVirtualIPs: []string{}}
	record := func(svc string) error {
		p := s.protocolOf(svc)
		if ch.Protocol == "" {
			ch.Protocol = p
		} else if ch.Protocol != p {
			return fmt.Errorf("discovery chain %q uses inconsistent protocols; service %q has %q which is not %q", service, svc, p, ch.Protocol)
		}
		return nil
	}
	addTarget := func(svc string, timeout time.Duration) string {
		id := targetID(svc)
		if _, ok := ch.Targets[id]; !ok {
			ch.Targets[id] = map[string]any{
				"ID": id, "Service": svc, "Namespace": "default", "Partition": "default", "Datacenter": consulDC,
				"ConnectTimeout": timeout.String(), "MeshGateway": map[string]any{}, "Subset": map[string]any{},
				"TransparentProxy": map[string]any{},
				"SNI":              svc + ".default." + consulDC + ".internal." + fakeTrustDomain,
				"Name":             svc + ".default." + consulDC + ".internal." + fakeTrustDomain,
			}
		}
		return id
	}
	resolverNode := func(svc string) (string, error) {
		if err := record(svc); err != nil {
			return "", err
		}
		node := "resolver:" + targetID(svc)
		if _, ok := ch.Nodes[node]; ok {
			return node, nil
		}
		timeout := 5 * time.Second
		res := map[string]any{}
		entry := s[kindResolver][svc]
		if entry != nil {
			if d, err := parseConsulDuration(entry["ConnectTimeout"]); err == nil && d > 0 {
				timeout = d
			}
		} else {
			res["Default"] = true
		}
		res["ConnectTimeout"] = timeout.String()
		res["Target"] = addTarget(svc, timeout)
		if entry != nil {
			var failover []string
			if fo, ok := entry["Failover"].(map[string]any); ok {
				if star, ok := fo["*"].(map[string]any); ok {
					if one, _ := star["Service"].(string); one != "" {
						failover = append(failover, one)
					}
					if ts, ok := star["Targets"].([]any); ok {
						for _, t := range ts {
							if m, ok := t.(map[string]any); ok {
								if svc, _ := m["Service"].(string); svc != "" {
									failover = append(failover, svc)
								}
							}
						}
					}
				}
			}
			if len(failover) > 0 {
				var ids []string
				for _, f := range failover {
					if err := record(f); err != nil {
						return "", err
					}
					ids = append(ids, addTarget(f, 5*time.Second))
				}
				res["Failover"] = map[string]any{"Targets": ids}
			}
		}
		ch.Nodes[node] = map[string]any{"Type": "resolver", "Name": targetID(svc), "Resolver": res}
		return node, nil
	}
	var splitterNode func(svc string) (string, error)
	// nextFor is where a request for svc goes: its splitter if it has one
	// (other than the one being built), else its resolver.
	nextFor := func(svc string) (string, error) {
		if s[kindSplitter][svc] != nil {
			return splitterNode(svc)
		}
		return resolverNode(svc)
	}
	splitterNode = func(svc string) (string, error) {
		node := "splitter:" + svc + ".default.default"
		if _, ok := ch.Nodes[node]; ok {
			return node, nil
		}
		if err := record(svc); err != nil {
			return "", err
		}
		ch.Nodes[node] = map[string]any{"Type": "splitter", "Name": svc + ".default.default"} // placeholder against cycles
		splits, _ := s[kindSplitter][svc]["Splits"].([]any)
		var out []map[string]any
		for _, sp := range splits {
			m, _ := sp.(map[string]any)
			target, _ := m["Service"].(string)
			if target == "" {
				target = svc
			}
			var next string
			var err error
			if target == svc {
				next, err = resolverNode(target)
			} else {
				next, err = nextFor(target)
			}
			if err != nil {
				return "", err
			}
			wt, _ := m["Weight"].(float64)
			out = append(out, map[string]any{"Definition": m, "Weight": wt, "NextNode": next})
		}
		ch.Nodes[node]["Splits"] = out
		return node, nil
	}

	if err := record(service); err != nil {
		return nil, err
	}
	router := s[kindRouter][service]
	advanced := router != nil || s[kindSplitter][service] != nil
	switch {
	case router != nil:
		node := "router:" + service + ".default.default"
		var routes []map[string]any
		list, _ := router["Routes"].([]any)
		for _, rt := range list {
			m, _ := rt.(map[string]any)
			dest := service
			if d, ok := m["Destination"].(map[string]any); ok {
				if svc, _ := d["Service"].(string); svc != "" {
					dest = svc
				}
			}
			next, err := nextFor(dest)
			if err != nil {
				return nil, err
			}
			routes = append(routes, map[string]any{"Definition": m, "NextNode": next})
		}
		next, err := nextFor(service)
		if err != nil {
			return nil, err
		}
		routes = append(routes, map[string]any{
			"Definition": map[string]any{
				"Match":       map[string]any{"HTTP": map[string]any{"PathPrefix": "/"}},
				"Destination": map[string]any{"Service": service, "Namespace": "default", "Partition": "default"},
			},
			"NextNode": next,
		})
		ch.Nodes[node] = map[string]any{"Type": "router", "Name": service + ".default.default", "Routes": routes}
		ch.StartNode = node
	default:
		next, err := nextFor(service)
		if err != nil {
			return nil, err
		}
		ch.StartNode = next
		ch.Default = !advanced && s[kindResolver][service] == nil
	}
	if advanced {
		switch ch.Protocol {
		case "http", "http2", "grpc":
		default:
			return nil, fmt.Errorf("discovery chain %q uses a protocol %q that does not permit advanced routing or splitting behavior", service, ch.Protocol)
		}
	}
	return ch, nil
}

func (c *Consul) discoveryChain(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	type result struct {
		ch  *chain
		err error
	}
	res, idx := block(r, &c.changed, c.quit, func() (result, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		ch, err := c.configSnapshotLocked().compile(name)
		return result{ch, err}, c.configIndex
	})
	if res.err != nil {
		writeText(w, readHeaders(idx), http.StatusInternalServerError, res.err.Error())
		return
	}
	writeJSON(w, readHeaders(idx), map[string]any{"Chain": res.ch})
}
