package consulroute

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Stand-ins are catalog registrations on nodes of their own, not the
// agent's services (issue 45). Registered on the replica's agent, every
// stand-in was one more service of that agent's node: the agent synced each
// one to the servers, and the servers' Catalog.Register reads every
// service of the node it registers on, so with 10,000 revisions at zero
// and three replicas (30,000 services on one node) each registration cost
// in proportion to what the node already held and deploy throughput fell
// from 34 to 8 services/s. On standInNodesPerReplica nodes of their own,
// without an agent, no agent syncs them, a node holds a sixteenth of one
// replica's stand-ins, and the leader removes a dead replica's stand-ins
// through any agent, one node at a time, whichever node it ran on.
const (
	// StandInNodePrefix begins the name of every catalog node that holds
	// stand-ins: "<prefix><replica>-<00..15>". The control plane's ACL
	// policy grants node write on it.
	StandInNodePrefix = "nomad-serverless-stand-ins-"
	// NodeMetaStandIns marks a stand-in node (node meta, value "true"),
	// so one catalog query lists them all.
	NodeMetaStandIns = "nomad-serverless-stand-ins"
	// standInNodesPerReplica bounds a node's services to 1/16 of one
	// replica's stand-ins (625 at 10,000 revisions) while keeping the
	// catalog's node list short (16 nodes per replica).
	standInNodesPerReplica = 16
	// standInCheckID is each stand-in's check, which passes from its
	// registration on: catalog-driven proxies (Fabio) route only to
	// instances with a passing check of their own.
	standInCheckID = "nomad-serverless-stand-in"
)

// StandInID is the Consul service ID of this replica's stand-in instance for
// a revision.
func (c *Client) StandInID(revision string) string {
	return revision + "-" + spec.TagActivator + "-" + c.replica
}

// StandInNode is the catalog node that holds this replica's stand-in for
// a revision: one of standInNodesPerReplica, by a hash of the name, so any
// replica of the same name finds it again.
func (c *Client) StandInNode(revision string) string {
	h := fnv.New32a()
	h.Write([]byte(revision))
	return fmt.Sprintf("%s%s-%02d", StandInNodePrefix, c.replica, h.Sum32()%standInNodesPerReplica)
}

// RegisterStandIn registers, in a revision's own Consul service, one
// instance pointing at this activator (addr:port), tagged activator:
// Knative's SKS proxy mode for catalog-driven proxies (Traefik, Fabio, Consul
// DNS) that do not read config entries. Call it while the revision has no
// ready instance; everything of ours that counts instances skips it.
//
// It is a catalog registration on StandInNode(revision), with a check of
// its own that passes from the registration on. Its check used to be an
// alias of this replica's activator registration, on the agent, but the
// agent evaluates an alias check by copying every check it holds, and
// every alias check of a replica again each time that replica's activator
// check runs: with 1,000 revisions at zero and three replicas, 75 % of the
// agent's CPU, growing with the square of the revisions (issue 45). A dead
// replica's stand-ins are removed by the leader (reapDeadReplicas in
// controlplane) within seconds, or by the replica's own sweep when it
// comes back.
//
// tags are the revision's own service tags (its instances'), which the
// stand-in carries too: such proxies are configured by the tags of each
// instance (Traefik skips an instance without traefik.enable=true and takes
// its router rule from them), so a stand-in without them would never get
// the request that should wake the revision.
func (c *Client) RegisterStandIn(ctx context.Context, revision, service string, addr string, port int, tags ...string) error {
	op := "register the activator stand-in for " + revision
	svc, _, ok := spec.ParseRevisionName(revision)
	switch {
	case !ok:
		return fmt.Errorf("%s: %q is not a revision name", op, revision)
	case svc != service:
		return fmt.Errorf("%s: it is not a revision of service %q", op, service)
	case addr == "":
		return fmt.Errorf("%s: address is empty", op)
	case port <= 0 || port > 65535:
		return fmt.Errorf("%s: port %d is not a TCP port", op, port)
	}
	all := []string{spec.TagServerless, spec.TagServicePrefix + service, spec.TagActivator}
	for _, t := range tags {
		if !slices.Contains(all, t) {
			all = append(all, t)
		}
	}
	id, node := c.StandInID(revision), c.StandInNode(revision)
	reg := &api.CatalogRegistration{
		Node:     node,
		Address:  addr,
		NodeMeta: map[string]string{NodeMetaStandIns: "true", MetaReplica: c.replica},
		// The node's address and meta are written when the node is
		// created; every later registration leaves the node alone.
		SkipNodeUpdate: true,
		Service: &api.AgentService{
			ID:      id,
			Service: revision,
			Tags:    all,
			Port:    port,
			Address: addr,
			Meta: map[string]string{
				spec.ServiceMetaService:  service,
				spec.ServiceMetaRevision: revision,
				MetaReplica:              c.replica,
			},
		},
		Check: &api.AgentCheck{
			Node:        node,
			CheckID:     standInCheckID + ":" + id,
			Name:        "nomad-serverless activator stand-in",
			Status:      api.HealthPassing,
			Output:      "the activator of control-plane replica " + c.replica + " takes this revision's requests while it has no ready instance",
			ServiceID:   id,
			ServiceName: revision,
		},
	}
	if _, err := c.api.Catalog().Register(reg, c.w(ctx)); err != nil {
		return c.wrap(op+" (catalog node "+node+")", err)
	}
	return nil
}

// DeregisterStandIn removes this replica's stand-in for a revision; an
// absent one is not an error.
func (c *Client) DeregisterStandIn(ctx context.Context, revision string) error {
	id, node := c.StandInID(revision), c.StandInNode(revision)
	_, err := c.api.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: id}, c.w(ctx))
	return c.wrap("deregister the activator stand-in "+id+" (catalog node "+node+")", err)
}

// StandInNode is a catalog node that holds stand-ins, and the replica
// whose they are.
type StandInNode struct {
	Node, Replica string
}

// StandInNodes lists the catalog nodes that hold stand-ins, every
// replica's, sorted by name: one catalog query.
func (c *Client) StandInNodes(ctx context.Context) ([]StandInNode, error) {
	q := c.q(ctx)
	q.NodeMeta = map[string]string{NodeMetaStandIns: "true"}
	nodes, _, err := c.api.Catalog().Nodes(q)
	if err != nil {
		return nil, c.wrap("list the catalog nodes of the activator stand-ins", err)
	}
	var out []StandInNode
	for _, n := range nodes {
		if n == nil || !strings.HasPrefix(n.Node, StandInNodePrefix) {
			continue
		}
		out = append(out, StandInNode{Node: n.Node, Replica: n.Meta[MetaReplica]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// OwnStandIns lists the revisions this replica has a stand-in of, read
// from the catalog (nodes lists the stand-in nodes: StandInNodes): a
// replica that restarts under the same name takes them back.
func (c *Client) OwnStandIns(ctx context.Context, nodes []StandInNode) ([]string, error) {
	var revs []string
	for _, n := range nodes {
		if n.Replica != c.replica {
			continue
		}
		list, _, err := c.api.Catalog().NodeServiceList(n.Node, c.q(ctx))
		if err != nil {
			return nil, c.wrap("list this replica's activator stand-ins on catalog node "+n.Node, err)
		}
		if list == nil || list.Node == nil {
			continue // removed since the listing
		}
		for _, s := range list.Services {
			if s != nil && s.ID == c.StandInID(s.Service) && c.StandInNode(s.Service) == n.Node {
				revs = append(revs, s.Service)
			}
		}
	}
	sort.Strings(revs)
	return revs, nil
}

// RemoveStandInNode deregisters a stand-in node and with it every stand-in
// it holds; an absent node is not an error.
func (c *Client) RemoveStandInNode(ctx context.Context, node string) error {
	if !strings.HasPrefix(node, StandInNodePrefix) {
		return fmt.Errorf("remove stand-in node %q: not a stand-in node (%s...)", node, StandInNodePrefix)
	}
	_, err := c.api.Catalog().Deregister(&api.CatalogDeregistration{Node: node}, c.w(ctx))
	return c.wrap("remove the activator stand-ins of catalog node "+node, err)
}

// RemoveStandInsOf deregisters every stand-in node of replica, and with
// them its stand-ins; it returns the nodes removed. The leader calls it
// for a dead replica, a replica for itself on its way out.
func (c *Client) RemoveStandInsOf(ctx context.Context, replica string) ([]string, error) {
	nodes, err := c.StandInNodes(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range nodes {
		if n.Replica != replica {
			continue
		}
		if err := c.RemoveStandInNode(ctx, n.Node); err != nil {
			return removed, err
		}
		removed = append(removed, n.Node)
	}
	return removed, nil
}

// AgentStandIn is a stand-in an earlier version registered on a Consul
// agent (before stand-ins were catalog registrations).
type AgentStandIn struct {
	ID       string
	Revision string
	// Replica is the control-plane replica that registered it.
	Replica string
}

// AgentStandIns lists the stand-ins the local Consul agent holds, which
// only an earlier version registered: a replica of this version removes
// those of its own name and of replicas no longer registered, as the
// earlier one did, so an upgrade leaves none behind. Only the agent that
// holds a registration can remove it for good (a catalog deregistration is
// undone by the agent's next sync).
func (c *Client) AgentStandIns(ctx context.Context) ([]AgentStandIn, error) {
	// No server-side filter: the agent's list is one call, and the
	// tag test below is the one place that says what a stand-in is.
	svcs, err := c.api.Agent().ServicesWithFilterOpts("", c.q(ctx))
	if err != nil {
		return nil, c.wrap("list the activator stand-ins on the local agent", err)
	}
	var out []AgentStandIn
	for id, s := range svcs {
		if s == nil || !slices.Contains(s.Tags, spec.TagActivator) || s.Service == spec.ActivatorServiceName {
			continue
		}
		out = append(out, AgentStandIn{ID: id, Revision: s.Service, Replica: s.Meta[MetaReplica]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RemoveAgentStandIn deregisters a stand-in the local agent holds, by ID
// (one AgentStandIns listed); an absent one is not an error.
func (c *Client) RemoveAgentStandIn(ctx context.Context, id string) error {
	return c.deregister(ctx, "remove the activator stand-in "+id+" from the local agent", id)
}
