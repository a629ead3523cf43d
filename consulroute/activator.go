package consulroute

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Service meta keys of the activator's registrations.
const (
	// MetaReplica names the control-plane replica that registered an
	// activator or stand-in instance.
	MetaReplica = "replica"
	// MetaDomain is the domain the gateway serves hosts under
	// (<service>.<namespace>.<domain>).
	MetaDomain = "domain"
	// MetaHTTPSPort is the gateway's HTTPS port, when it has one.
	MetaHTTPSPort = "https-port"
	// MetaInternal is the address (host:port) of the gateway's internal
	// listener, when it has one.
	MetaInternal = "internal"
)

// ActivatorRegistration is one control-plane replica's entry in the
// nomad-serverless-activator service.
type ActivatorRegistration struct {
	// ID is the Consul service ID; default
	// "nomad-serverless-activator-<replica>", unique per replica.
	ID string
	// Address and Port are where the gateway/activator serves requests.
	Address string
	Port    int
	// AdminPort serves /healthz (and metrics); the check polls it.
	AdminPort int
	// Domain is the gateway's host domain, so `deploy` can print a URL.
	Domain string
	// HTTPSPort is the gateway's HTTPS port (0: none).
	HTTPSPort int
	// InternalAddress and InternalPort are where the gateway's internal
	// listener serves every service, internal ones included (port 0:
	// none). It is registered as its own instance of
	// spec.InternalServiceName, which internal services' revisions fail
	// over to in the mesh.
	InternalAddress string
	InternalPort    int
	// CheckInterval and CheckTimeout of the HTTP check; default 2s and 1s.
	CheckInterval time.Duration
	CheckTimeout  time.Duration
	// DeregisterAfter removes a replica whose check stayed critical this
	// long (a crashed replica); default 1m.
	DeregisterAfter time.Duration
}

func (c *Client) activatorID(id string) string {
	if id != "" {
		return id
	}
	return spec.ActivatorServiceName + "-" + c.replica
}

// internalID is the Consul service ID of the internal listener of the
// replica whose activator registration is activatorID.
func internalID(activatorID string) string {
	return spec.InternalServiceName + "-" + strings.TrimPrefix(activatorID, spec.ActivatorServiceName+"-")
}

// RegisterActivator registers this replica in the nomad-serverless-activator
// service with an HTTP check on its admin /healthz, after making sure the
// service's protocol is http (revision resolvers fail over to it, and
// Consul needs the protocols to match: fixture 030). Registering again
// replaces the registration.
func (c *Client) RegisterActivator(ctx context.Context, reg ActivatorRegistration) error {
	op := "register the activator"
	switch {
	case reg.Address == "":
		return fmt.Errorf("%s: address is empty", op)
	case reg.Port <= 0 || reg.Port > 65535:
		return fmt.Errorf("%s: port %d is not a TCP port", op, reg.Port)
	case reg.AdminPort <= 0 || reg.AdminPort > 65535:
		return fmt.Errorf("%s: admin port %d is not a TCP port", op, reg.AdminPort)
	case reg.InternalPort < 0 || reg.InternalPort > 65535:
		return fmt.Errorf("%s: internal port %d is not a TCP port", op, reg.InternalPort)
	case reg.InternalPort != 0 && reg.InternalAddress == "":
		return fmt.Errorf("%s: the internal listener's address is empty", op)
	}
	if reg.CheckInterval <= 0 {
		reg.CheckInterval = 2 * time.Second
	}
	if reg.CheckTimeout <= 0 {
		reg.CheckTimeout = time.Second
	}
	if reg.DeregisterAfter <= 0 {
		reg.DeregisterAfter = time.Minute
	}
	if err := c.ensureHTTPDefaults(ctx, spec.ActivatorServiceName); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	svc := &api.AgentServiceRegistration{
		ID:      c.activatorID(reg.ID),
		Name:    spec.ActivatorServiceName,
		Tags:    []string{spec.TagServerless},
		Port:    reg.Port,
		Address: reg.Address,
		Meta: map[string]string{
			spec.ServiceMetaAdminPort: strconv.Itoa(reg.AdminPort),
			MetaReplica:               c.replica,
		},
		Check: &api.AgentServiceCheck{
			Name:                           "activator healthz",
			HTTP:                           "http://" + net.JoinHostPort(reg.Address, strconv.Itoa(reg.AdminPort)) + "/healthz",
			Interval:                       reg.CheckInterval.String(),
			Timeout:                        reg.CheckTimeout.String(),
			DeregisterCriticalServiceAfter: reg.DeregisterAfter.String(),
			// Passing from the start: serve registers once its listeners
			// are open, and the stand-ins' alias checks mirror this one,
			// so a check that started critical would take every stand-in
			// out of catalog-driven proxies until its first probe.
			Status: api.HealthPassing,
		},
	}
	if reg.Domain != "" {
		svc.Meta[MetaDomain] = reg.Domain
	}
	if reg.HTTPSPort != 0 {
		svc.Meta[MetaHTTPSPort] = strconv.Itoa(reg.HTTPSPort)
	}
	internal := net.JoinHostPort(reg.InternalAddress, strconv.Itoa(reg.InternalPort))
	if reg.InternalPort != 0 {
		svc.Meta[MetaInternal] = internal
	}
	if err := c.api.Agent().ServiceRegisterOpts(svc, api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx)); err != nil {
		return c.wrap(op+" "+svc.ID, err)
	}
	if reg.InternalPort == 0 {
		return nil
	}
	if err := c.ensureHTTPDefaults(ctx, spec.InternalServiceName); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	in := &api.AgentServiceRegistration{
		ID:      internalID(svc.ID),
		Name:    spec.InternalServiceName,
		Tags:    []string{spec.TagServerless},
		Port:    reg.InternalPort,
		Address: reg.InternalAddress,
		Meta:    map[string]string{MetaReplica: c.replica, MetaInternal: internal},
		Check: &api.AgentServiceCheck{
			Name: "gateway healthy",
			// An alias of the activator registration's check: the
			// internal listener lives and dies with the same serve, and
			// Consul probes nothing more for it.
			AliasService:                   svc.ID,
			Status:                         api.HealthPassing,
			DeregisterCriticalServiceAfter: reg.DeregisterAfter.String(),
		},
	}
	if reg.Domain != "" {
		in.Meta[MetaDomain] = reg.Domain
	}
	if err := c.api.Agent().ServiceRegisterOpts(in, api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx)); err != nil {
		return c.wrap(op+": register the internal listener "+in.ID, err)
	}
	return nil
}

// Gateway is one running control-plane replica as registered in the
// nomad-serverless-activator service.
type Gateway struct {
	ID        string `json:"id"`
	Replica   string `json:"replica,omitempty"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
	AdminPort int    `json:"admin_port,omitempty"`
	Domain    string `json:"domain,omitempty"`
	HTTPSPort int    `json:"https_port,omitempty"`
	// Internal is the address (host:port) of the replica's internal
	// listener; "" when it has none.
	Internal string `json:"internal,omitempty"`
}

// HostPort is where the gateway serves requests.
func (g Gateway) HostPort() string { return net.JoinHostPort(g.Address, strconv.Itoa(g.Port)) }

// AdminHostPort is where the replica serves its admin API.
func (g Gateway) AdminHostPort() string {
	return net.JoinHostPort(g.Address, strconv.Itoa(g.AdminPort))
}

// LeaderGateway is the registration of the replica that holds the lock on
// key (AutoscalerLockKey: the autoscaler's leader), found by the replica
// name the lock's value holds. It reports false when nobody holds the lock,
// or the holder has no passing registration with an admin port (yet).
func (c *Client) LeaderGateway(ctx context.Context, key string) (Gateway, bool, error) {
	holder, held, err := c.Leader(ctx, key)
	if err != nil || !held {
		return Gateway{}, false, err
	}
	gws, err := c.Gateways(ctx)
	if err != nil {
		return Gateway{}, false, err
	}
	for _, g := range gws {
		if g.Replica == holder && g.AdminPort != 0 {
			return g, true, nil
		}
	}
	return Gateway{}, false, nil
}

// Gateways lists the control-plane replicas whose check passes, sorted by
// ID: where users' requests enter.
func (c *Client) Gateways(ctx context.Context) ([]Gateway, error) {
	entries, _, err := c.api.Health().Service(spec.ActivatorServiceName, "", true, c.q(ctx))
	if err != nil {
		return nil, c.wrap("list the gateways ("+spec.ActivatorServiceName+")", err)
	}
	out := make([]Gateway, 0, len(entries))
	for _, e := range entries {
		if e == nil || e.Service == nil {
			continue
		}
		g := Gateway{ID: e.Service.ID, Address: e.Service.Address, Port: e.Service.Port,
			Replica: e.Service.Meta[MetaReplica], Domain: e.Service.Meta[MetaDomain]}
		if g.Address == "" && e.Node != nil {
			g.Address = e.Node.Address
		}
		g.AdminPort, _ = strconv.Atoi(e.Service.Meta[spec.ServiceMetaAdminPort])
		g.HTTPSPort, _ = strconv.Atoi(e.Service.Meta[MetaHTTPSPort])
		g.Internal = e.Service.Meta[MetaInternal]
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ActivatorRegistered reports whether the local Consul agent still holds
// this replica's activator registration (id as given to RegisterActivator;
// empty for the default). The agent loses it when it reaps the service
// after its check stayed critical for DeregisterAfter (serve stalled, or
// its admin address was unreachable), or when it restarts without its
// state (a -dev agent); nothing registers it again unless serve does.
func (c *Client) ActivatorRegistered(ctx context.Context, id string) (bool, error) {
	id = c.activatorID(id)
	_, _, err := c.api.Agent().Service(id, c.q(ctx))
	switch err = c.wrap("look up the activator registration "+id+" on the local agent", err); {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// DeregisterActivator removes this replica's activator registration (id as
// given to RegisterActivator; empty for the default).
func (c *Client) DeregisterActivator(ctx context.Context, id string) error {
	id = c.activatorID(id)
	// The internal listener first: its check is an alias of the
	// activator's, and the mesh must stop failing over to it.
	if err := c.deregister(ctx, "deregister the internal listener "+internalID(id), internalID(id)); err != nil {
		return err
	}
	return c.deregister(ctx, "deregister the activator "+id, id)
}

// deregister removes a service registration from the local agent; an
// absent one is not an error.
func (c *Client) deregister(ctx context.Context, op, id string) error {
	err := c.wrap(op, c.api.Agent().ServiceDeregisterOpts(id, c.q(ctx)))
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// ensureHTTPDefaults writes service-defaults protocol http for name unless
// it already says so.
func (c *Client) ensureHTTPDefaults(ctx context.Context, name string) error {
	e, err := c.getEntry(ctx, api.ServiceDefaults, name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	cur, _ := e.(*api.ServiceConfigEntry)
	if cur != nil && cur.Protocol == ProtocolHTTP {
		return nil
	}
	return c.setEntry(ctx, withProtocol(cur, serviceDefaults(name)))
}
