package consulroute

import (
	"encoding/json"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// ResolverConnectTimeout is the connect timeout of every revision's resolver.
const ResolverConnectTimeout = 2 * time.Second

// ProtocolHTTP is the protocol every service, revision and the activator
// gets in service-defaults: Consul splits and routes only L7 protocols
// (fixture 039 shows the refusal otherwise).
const ProtocolHTTP = "http"

// entrySet is every config entry Publish wants for one record, in the order
// they are written. It is computed without I/O.
type entrySet struct {
	service string
	// defaults: the service, each revision (sorted), the activator.
	defaults []*api.ServiceConfigEntry
	// resolvers: one per published revision, failing over to the activator.
	resolvers []*api.ServiceResolverConfigEntry
	// router is nil when the route has no tags: then no router entry should
	// exist.
	router   *api.ServiceRouterConfigEntry
	splitter *api.ServiceSplitterConfigEntry
	// stale revisions lose their resolver and service-defaults after the
	// router and splitter stop naming them.
	stale []string
}

func desiredEntries(rec Record, route Route) entrySet {
	stale := slices.Clone(rec.Deleting)
	sort.Strings(stale)
	stale = slices.Compact(stale)
	revs := slices.DeleteFunc(slices.Clone(rec.Revisions), func(r string) bool { return slices.Contains(stale, r) })
	sort.Strings(revs)
	revs = slices.Compact(revs)
	set := entrySet{service: rec.Service.Name, stale: stale}

	set.defaults = append(set.defaults, serviceDefaults(rec.Service.Name))
	for _, rev := range revs {
		set.defaults = append(set.defaults, serviceDefaults(rev))
	}
	set.defaults = append(set.defaults, serviceDefaults(spec.ActivatorServiceName))
	internal := rec.Service.Internal()
	if internal {
		set.defaults = append(set.defaults, serviceDefaults(spec.InternalServiceName))
	}

	for _, rev := range revs {
		set.resolvers = append(set.resolvers, revisionResolver(rev, internal))
	}
	set.router = routerFor(route)
	set.splitter = splitterFor(route)
	return set
}

func serviceDefaults(name string) *api.ServiceConfigEntry {
	return &api.ServiceConfigEntry{Kind: api.ServiceDefaults, Name: name, Protocol: ProtocolHTTP}
}

// withProtocol is the service-defaults to write when cur (nil: none) does
// not say want's protocol: cur with only the protocol changed, keeping
// whatever else someone configured for the service, or want itself.
func withProtocol(cur, want *api.ServiceConfigEntry) *api.ServiceConfigEntry {
	if cur == nil {
		return want
	}
	merged := *cur
	merged.Protocol, merged.CreateIndex, merged.ModifyIndex = want.Protocol, 0, 0
	return &merged
}

// revisionResolver fails over to the activator when the revision has no
// healthy instance, so a mesh client calling a scaled-to-zero revision
// reaches the activator, which wakes it (fixture 033). An internal
// service's revisions fail over to the gateways' internal listeners
// (spec.InternalServiceName) instead: the public port answers an internal
// revision named by X-Serverless-Revision as one that does not exist.
func revisionResolver(rev string, internal bool) *api.ServiceResolverConfigEntry {
	target := spec.ActivatorServiceName
	if internal {
		target = spec.InternalServiceName
	}
	return &api.ServiceResolverConfigEntry{
		Kind:           api.ServiceResolver,
		Name:           rev,
		ConnectTimeout: ResolverConnectTimeout,
		Failover: map[string]api.ServiceResolverFailover{
			"*": {Targets: []api.ServiceResolverFailoverTarget{{Service: target}}},
		},
	}
}

func setRevisionHeader(rev string) *api.HTTPHeaderModifiers {
	return &api.HTTPHeaderModifiers{Set: map[string]string{spec.RevisionHeader: rev}}
}

// splitterFor has one split per revision carrying traffic, in the route's
// order, each setting X-Serverless-Revision (fixture 031).
func splitterFor(route Route) *api.ServiceSplitterConfigEntry {
	e := &api.ServiceSplitterConfigEntry{Kind: api.ServiceSplitter, Name: route.Service}
	for _, s := range route.Splits {
		e.Splits = append(e.Splits, api.ServiceSplit{
			Weight:         float32(s.Percent),
			Service:        s.Revision,
			RequestHeaders: setRevisionHeader(s.Revision),
		})
	}
	return e
}

// routerFor routes X-Serverless-Tag: <tag> to the tagged revision, tags in
// name order (fixture 032). Requests without the header fall through to the
// splitter: Consul adds that catch-all route itself (fixture 037).
func routerFor(route Route) *api.ServiceRouterConfigEntry {
	if len(route.Tags) == 0 {
		return nil
	}
	tags := make([]string, 0, len(route.Tags))
	for t := range route.Tags {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	e := &api.ServiceRouterConfigEntry{Kind: api.ServiceRouter, Name: route.Service}
	for _, t := range tags {
		rev := route.Tags[t]
		e.Routes = append(e.Routes, api.ServiceRoute{
			Match: &api.ServiceRouteMatch{HTTP: &api.ServiceRouteHTTPMatch{
				Header: []api.ServiceRouteHTTPMatchHeader{{Name: spec.TagHeader, Exact: t}},
			}},
			Destination: &api.ServiceRouteDestination{Service: rev, RequestHeaders: setRevisionHeader(rev)},
		})
	}
	return e
}

// routeFromEntries reads a Route back from a splitter and a router (either
// may be nil).
func routeFromEntries(service string, sp *api.ServiceSplitterConfigEntry, rt *api.ServiceRouterConfigEntry) Route {
	r := Route{Service: service}
	if sp != nil {
		for _, s := range sp.Splits {
			if s.Weight <= 0 {
				continue
			}
			r.Splits = append(r.Splits, Split{Revision: s.Service, Percent: int(math.Round(float64(s.Weight)))})
		}
	}
	if rt != nil {
		for _, route := range rt.Routes {
			if route.Match == nil || route.Match.HTTP == nil || route.Destination == nil {
				continue
			}
			for _, h := range route.Match.HTTP.Header {
				if h.Name == spec.TagHeader && h.Exact != "" && !h.Invert {
					if r.Tags == nil {
						r.Tags = map[string]string{}
					}
					r.Tags[h.Exact] = route.Destination.Service
				}
			}
		}
	}
	return r
}

// sameEntry reports whether an entry read from Consul already says what we
// want: both are compared in their JSON form with the fields Consul fills
// in (indexes, CE namespace and partition) cleared.
func sameEntry(have, want api.ConfigEntry) bool {
	a, err1 := canonicalEntry(have)
	b, err2 := canonicalEntry(want)
	return err1 == nil && err2 == nil && a == b
}

func canonicalEntry(e api.ConfigEntry) (string, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	for _, k := range []string{"CreateIndex", "ModifyIndex", "Namespace", "Partition"} {
		delete(m, k)
	}
	out, err := json.Marshal(pruneZero(m))
	return string(out), err
}

// pruneZero drops zero values (nil, "", 0, false, {}, []) so that fields one
// side leaves out and the other sends as zero compare equal.
func pruneZero(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if p := pruneZero(e); p != nil {
				out[k] = p
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case []any:
		if len(x) == 0 {
			return nil
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = pruneZero(e)
		}
		return out
	case string:
		if x == "" {
			return nil
		}
	case float64:
		if x == 0 {
			return nil
		}
	case bool:
		if !x {
			return nil
		}
	}
	return v
}

// ConfigEntries are the config entries Publish writes for rec, in the order
// it writes them: what `render` shows.
func ConfigEntries(rec Record) ([]api.ConfigEntry, error) {
	route, err := rec.validate()
	if err != nil {
		return nil, err
	}
	set := desiredEntries(rec, route)
	var out []api.ConfigEntry
	for _, e := range set.defaults {
		out = append(out, e)
	}
	for _, e := range set.resolvers {
		out = append(out, e)
	}
	if set.router != nil {
		out = append(out, set.router)
	}
	out = append(out, set.splitter)
	return out, nil
}
