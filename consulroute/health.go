package consulroute

import (
	"context"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"
)

// InstanceHealth is one instance of a revision with its Consul health,
// passing or not: what `deploy` shows while it waits and when it gives up.
type InstanceHealth struct {
	Instance
	// Passing is true when every check of the instance (and of its node)
	// passes; Status is Consul's aggregate: passing, warning or critical.
	Passing bool   `json:"passing"`
	Status  string `json:"status"`
	// Output is what the failing checks said (the sidecar relays the app's
	// readiness failure), or the service check's output when all pass.
	Output string `json:"output,omitempty"`
}

// Health lists every instance of a revision with its health (fixtures 024,
// 025), sorted by ID; the activator's stand-ins are left out.
func (c *Client) Health(ctx context.Context, revision string) ([]InstanceHealth, error) {
	entries, _, err := c.api.Health().Service(revision, "", false, c.q(ctx))
	if err != nil {
		return nil, c.wrap("read the health of "+revision, err)
	}
	out := make([]InstanceHealth, 0, len(entries))
	for _, e := range entries {
		if !isInstance(e) {
			continue
		}
		h := InstanceHealth{Instance: instanceFrom(revision, e), Status: e.Checks.AggregatedStatus()}
		h.Passing = h.Status == api.HealthPassing
		var failing, service []string
		for _, chk := range e.Checks {
			out := strings.TrimSpace(chk.Output)
			if out == "" {
				continue
			}
			if chk.Status != api.HealthPassing {
				failing = append(failing, out)
			} else if chk.ServiceID != "" {
				service = append(service, out)
			}
		}
		if len(failing) > 0 {
			h.Output = strings.Join(failing, "; ")
		} else {
			h.Output = strings.Join(service, "; ")
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Registration is one entry of a revision's Consul service, an instance or
// an activator stand-in, whatever its health: what `delete` waits to see
// gone.
type Registration struct {
	ID     string `json:"id"`
	Node   string `json:"node"`
	Status string `json:"status"`
	// Replica is the control-plane replica whose stand-in this is; ""
	// for an instance.
	Replica string `json:"replica,omitempty"`
}

// Registrations lists everything registered in a revision's Consul service
// on every node, stand-ins included, sorted by ID, and the index to block
// on. With index > 0 it is a blocking query: it answers when the list
// changes, or when ctx ends (an error then).
func (c *Client) Registrations(ctx context.Context, revision string, index uint64) ([]Registration, uint64, error) {
	entries, meta, err := c.api.Health().Service(revision, "", false, c.blocking(ctx, index))
	if err != nil {
		return nil, 0, c.wrap("list the registrations of "+revision, err)
	}
	out := make([]Registration, 0, len(entries))
	for _, e := range entries {
		if e == nil || e.Service == nil {
			continue
		}
		r := Registration{ID: e.Service.ID, Status: e.Checks.AggregatedStatus()}
		if e.Node != nil {
			r.Node = e.Node.Node
		}
		if !isInstance(e) {
			r.Replica = e.Service.Meta[MetaReplica]
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, meta.LastIndex, nil
}
