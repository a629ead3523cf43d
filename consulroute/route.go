// Package consulroute holds the Consul side of nomad-serverless: the route
// config entries (service-defaults, service-splitter, service-router,
// service-resolver), the KV copy of each applied service, ready instances
// (blocking queries), the activator's registrations and the leader lock.
package consulroute

import (
	"fmt"
	"sort"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Route is how a service's requests split over its revisions and which
// revisions have tags. It is what the config entries say, with "latest"
// already resolved to a revision name.
type Route struct {
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	// Splits carry traffic; every Percent is above 0 and they add to 100.
	Splits []Split `json:"splits"`
	// Tags maps a tag to the revision it names.
	Tags map[string]string `json:"tags,omitempty"`
}

// Split is one revision's share of a service's traffic.
type Split struct {
	Revision string `json:"revision"`
	Percent  int    `json:"percent"`
}

// Revisions lists every revision the route names (splits and tags), sorted.
func (r Route) Revisions() []string {
	seen := map[string]bool{}
	for _, s := range r.Splits {
		seen[s.Revision] = true
	}
	for _, rev := range r.Tags {
		seen[rev] = true
	}
	out := make([]string, 0, len(seen))
	for rev := range seen {
		out = append(out, rev)
	}
	sort.Strings(out)
	return out
}

// RouteFor turns a service's traffic list into a route, with latest standing
// for the named revision. Targets of the same revision are merged; targets
// with 0 percent carry only their tag.
func RouteFor(s *spec.Service, latest string) (Route, error) {
	r := Route{Service: s.Name, Namespace: s.Namespace}
	idx := map[string]int{}
	for _, t := range s.EffectiveTraffic() {
		rev := t.Revision
		if t.Latest {
			if latest == "" {
				return Route{}, fmt.Errorf("route for %s: traffic names latest but the service has no revision yet", s.Name)
			}
			rev = latest
		}
		if t.Tag != "" {
			if r.Tags == nil {
				r.Tags = map[string]string{}
			}
			r.Tags[t.Tag] = rev
		}
		if t.Percent == 0 {
			continue
		}
		if i, ok := idx[rev]; ok {
			r.Splits[i].Percent += t.Percent
			continue
		}
		idx[rev] = len(r.Splits)
		r.Splits = append(r.Splits, Split{Revision: rev, Percent: t.Percent})
	}
	return r, nil
}

// Instance is one ready instance of a revision as Consul lists it.
type Instance struct {
	// ID is the Consul service ID (Nomad names it after the allocation).
	ID       string `json:"id"`
	Revision string `json:"revision"`
	Address  string `json:"address"`
	// Port is the sidecar's serving port; AdminPort its stats port.
	Port      int `json:"port"`
	AdminPort int `json:"admin_port"`
}

// HostPort is the instance's serving address.
func (i Instance) HostPort() string { return fmt.Sprintf("%s:%d", i.Address, i.Port) }
