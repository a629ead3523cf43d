package consulroute

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// ReplicaRegistration is one control-plane replica's activator
// registration, as the catalog lists it, with the agent that holds it.
type ReplicaRegistration struct {
	Replica string
	// ID is the activator registration's service ID.
	ID string
	// Node and NodeAddress name the agent that holds the registration
	// and the replica's internal listener (its stand-ins are on catalog
	// nodes of their own).
	Node, NodeAddress string
	// Critical: the registration's check is critical (the replica's
	// admin /healthz does not answer).
	Critical bool
}

// ReplicaRegistrations lists every replica registered in the
// nomad-serverless-activator service, whatever its health.
func (c *Client) ReplicaRegistrations(ctx context.Context) ([]ReplicaRegistration, error) {
	entries, _, err := c.api.Health().Service(spec.ActivatorServiceName, "", false, c.q(ctx))
	if err != nil {
		return nil, c.wrap("list the control-plane replicas ("+spec.ActivatorServiceName+")", err)
	}
	var out []ReplicaRegistration
	for _, e := range entries {
		if e == nil || e.Service == nil || e.Node == nil || e.Service.Meta[MetaReplica] == "" {
			continue
		}
		out = append(out, ReplicaRegistration{
			Replica: e.Service.Meta[MetaReplica], ID: e.Service.ID,
			Node: e.Node.Node, NodeAddress: e.Node.Address,
			Critical: e.Checks.AggregatedStatus() == api.HealthCritical,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Replicas lists the names of the control-plane replicas registered in the
// nomad-serverless-activator service, whatever their health: a replica
// that crashed stays listed (critical) until the leader or Consul removes
// it, and a stopped one deregisters.
func (c *Client) Replicas(ctx context.Context) (map[string]bool, error) {
	regs, err := c.ReplicaRegistrations(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(regs))
	for _, r := range regs {
		out[r.Replica] = true
	}
	return out, nil
}

// SessionHolders names the replicas that hold a Consul session bound to
// their activator check (every replica holds one while it waits for or
// holds the leader lock: WithSessionCheck). Consul ends such a session the
// moment the check turns critical or the node fails, so a replica missing
// here is dead or cut off.
func (c *Client) SessionHolders(ctx context.Context) (map[string]bool, error) {
	sessions, _, err := c.api.Session().List(c.q(ctx))
	if err != nil {
		return nil, c.wrap("list Consul sessions", err)
	}
	prefix := "service:" + spec.ActivatorServiceName + "-"
	out := map[string]bool{}
	for _, s := range sessions {
		if s == nil {
			continue
		}
		ids := slices.Clone(s.Checks)
		for _, sc := range s.ServiceChecks {
			ids = append(ids, sc.ID)
		}
		for _, id := range ids {
			if r, ok := strings.CutPrefix(id, prefix); ok && r != "" {
				out[r] = true
			}
		}
	}
	return out, nil
}

// RemoveReplica removes every registration of replica r: first its
// stand-ins (its stand-in nodes in the catalog, through any agent), then,
// through the agent that holds them (r.Node), its internal listener and
// last its activator registration. Only that agent can remove the last two
// for good: a catalog deregistration is undone by the agent's next sync,
// and left alone the agent reaps them only a minute after their checks
// turned critical. It returns the stand-in nodes and service IDs removed.
// The agent is reached at the node's address on this client's port
// (AgentOf), or is this client's own agent when the node is its node; when
// it cannot be reached the stand-ins are gone all the same.
func (c *Client) RemoveReplica(ctx context.Context, r ReplicaRegistration) ([]string, error) {
	op := fmt.Sprintf("remove the registrations of replica %s from the agent of node %s", r.Replica, r.Node)
	removed, err := c.RemoveStandInsOf(ctx, r.Replica)
	if err != nil {
		return removed, fmt.Errorf("remove the stand-ins of replica %s: %w", r.Replica, err)
	}
	agent, err := c.agentFor(ctx, r.Node, r.NodeAddress)
	if err != nil {
		return removed, fmt.Errorf("%s: %w", op, err)
	}
	svcs, err := agent.api.Agent().ServicesWithFilterOpts("", agent.q(ctx))
	if err != nil {
		return removed, agent.wrap(op+": list its services", err)
	}
	var ids []string
	for id, s := range svcs {
		if s == nil || s.Meta[MetaReplica] != r.Replica || id == r.ID {
			continue
		}
		// Tag activator: stand-ins an earlier version registered on the
		// agent.
		if s.Service == spec.InternalServiceName || slices.Contains(s.Tags, spec.TagActivator) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	if _, ok := svcs[r.ID]; ok {
		ids = append(ids, r.ID) // last: while it is there, the others are its
	}
	for _, id := range ids {
		if err := agent.deregister(ctx, op, id); err != nil {
			return removed, err
		}
		removed = append(removed, id)
	}
	return removed, nil
}

// agentFor is a client of the agent of node: this client itself when the
// node is its agent's, else AgentOf(address).
func (c *Client) agentFor(ctx context.Context, node, address string) (*Client, error) {
	self, err := c.api.Agent().NodeName()
	if err != nil {
		return nil, c.wrap("read the local agent's node name", err)
	}
	if node == self {
		return c, nil
	}
	return c.AgentOf(address)
}

// AgentOf is a client of the Consul agent at address (a node's address in
// the catalog), reached as this client reaches its own: same scheme, port,
// token and TLS settings. Agents of one cluster listen on one HTTP port by
// convention (8500, or 8501 with TLS); a cluster that varies it per node
// cannot be reached this way, and the stand-ins there wait for the agent's
// reap a minute after their checks fail.
func (c *Client) AgentOf(address string) (*Client, error) {
	if address == "" {
		return nil, fmt.Errorf("the node has no address")
	}
	cfg := c.cfg
	raw := cfg.Address
	if raw == "" {
		raw = "127.0.0.1:8500"
	}
	if strings.HasPrefix(raw, "unix://") {
		return nil, fmt.Errorf("this client reaches its agent on a unix socket (%s), so the agent at %s has no known HTTP address", raw, address)
	}
	if !strings.Contains(raw, "://") {
		raw = "//" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("read this client's Consul address %q: %w", cfg.Address, err)
	}
	port := u.Port()
	if port == "" {
		port = "8500"
	}
	cfg.Address = net.JoinHostPort(address, port)
	if u.Scheme != "" {
		cfg.Scheme = u.Scheme
	}
	a, err := api.NewClient(&cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client for the agent at %s: %w", cfg.Address, err)
	}
	other := *c
	other.api, other.cfg, other.addr = a, cfg, displayAddr(&cfg)
	return &other, nil
}
