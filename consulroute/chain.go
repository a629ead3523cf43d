package consulroute

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Chain is Consul's compiled view of a service's routing
// (/v1/discovery-chain/<service>): what a mesh proxy actually does, after
// Consul merged the router, splitter, resolvers and defaults. Tests and
// `status` assert routing here rather than on the entries we wrote.
type Chain struct {
	Service  string `json:"service"`
	Protocol string `json:"protocol"`
	// Default is true when no router, splitter or resolver applies.
	Default bool `json:"default"`
	// Routes are the router's routes in match order, including the
	// catch-all Consul adds (empty Header, PathPrefix "/").
	Routes []ChainRoute `json:"routes,omitempty"`
	// Splits are the splits plain requests (no tag header) go through.
	Splits []ChainSplit `json:"splits,omitempty"`
	// Resolvers by the service they resolve.
	Resolvers map[string]ChainResolver `json:"resolvers"`
}

// ChainRoute is one compiled router route.
type ChainRoute struct {
	// Header and Exact are the header match ("X-Serverless-Tag", "old");
	// empty for a route without one.
	Header     string `json:"header,omitempty"`
	Exact      string `json:"exact,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
	// Service is the route's destination; ToSplitter is true when the route
	// continues into the splitter rather than straight to a resolver.
	Service    string            `json:"service"`
	ToSplitter bool              `json:"to_splitter,omitempty"`
	SetHeaders map[string]string `json:"set_headers,omitempty"`
}

// ChainSplit is one compiled split.
type ChainSplit struct {
	Service    string            `json:"service"`
	Weight     float64           `json:"weight"`
	SetHeaders map[string]string `json:"set_headers,omitempty"`
}

// ChainResolver is one compiled resolver: where its target's traffic goes
// when the target has no healthy instance.
type ChainResolver struct {
	Service        string        `json:"service"`
	ConnectTimeout time.Duration `json:"connect_timeout"`
	// Failover lists the services failed over to, in order.
	Failover []string `json:"failover,omitempty"`
}

// Route is the route the chain implements: splits from the splitter, tags
// from router routes matching X-Serverless-Tag exactly.
func (ch Chain) Route() Route {
	r := Route{Service: ch.Service}
	for _, s := range ch.Splits {
		r.Splits = append(r.Splits, Split{Revision: s.Service, Percent: int(math.Round(s.Weight))})
	}
	for _, rt := range ch.Routes {
		if rt.Header == spec.TagHeader && rt.Exact != "" {
			if r.Tags == nil {
				r.Tags = map[string]string{}
			}
			r.Tags[rt.Exact] = rt.Service
		}
	}
	return r
}

// The wire form of /v1/discovery-chain. The API client's own types drop the
// split and route definitions (the headers set), so this package decodes
// the parts it asserts on itself.
type rawChainResponse struct {
	Chain *rawChain
}

type rawChain struct {
	ServiceName string
	Protocol    string
	Default     bool
	StartNode   string
	Nodes       map[string]*rawNode
	Targets     map[string]*struct{ Service string }
}

type rawNode struct {
	Type   string
	Name   string
	Routes []struct {
		Definition struct {
			Match *struct {
				HTTP *struct {
					PathPrefix string
					Header     []struct {
						Name  string
						Exact string
					}
				}
			}
			Destination *struct {
				Service        string
				RequestHeaders *struct{ Set map[string]string }
			}
		}
		NextNode string
	}
	Splits []struct {
		Definition struct {
			Service        string
			RequestHeaders *struct{ Set map[string]string }
		}
		Weight   float64
		NextNode string
	}
	Resolver *struct {
		ConnectTimeout string
		Target         string
		Failover       *struct{ Targets []string }
	}
}

// DiscoveryChain reads and parses Consul's compiled discovery chain for a
// service.
func (c *Client) DiscoveryChain(ctx context.Context, service string) (Chain, error) {
	op := "read the discovery chain of " + service
	var raw rawChainResponse
	if _, err := c.api.Raw().Query("/v1/discovery-chain/"+url.PathEscape(service), &raw, c.q(ctx)); err != nil {
		return Chain{}, c.wrap(op, err)
	}
	if raw.Chain == nil {
		return Chain{}, fmt.Errorf("%s: Consul's answer has no chain", op)
	}
	ch, err := parseChain(raw.Chain)
	if err != nil {
		return Chain{}, fmt.Errorf("%s: %w", op, err)
	}
	return ch, nil
}

func parseChain(rc *rawChain) (Chain, error) {
	ch := Chain{
		Service:   rc.ServiceName,
		Protocol:  rc.Protocol,
		Default:   rc.Default,
		Resolvers: map[string]ChainResolver{},
	}
	targetService := func(id string) string {
		if t, ok := rc.Targets[id]; ok && t != nil && t.Service != "" {
			return t.Service
		}
		// Target IDs are service.namespace.partition.datacenter.
		s, _, _ := strings.Cut(id, ".")
		return s
	}
	// Resolvers, keyed by the service of their target.
	names := make([]string, 0, len(rc.Nodes))
	for n := range rc.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		node := rc.Nodes[n]
		if node == nil || node.Type != "resolver" || node.Resolver == nil {
			continue
		}
		res := ChainResolver{Service: targetService(node.Resolver.Target)}
		if node.Resolver.ConnectTimeout != "" {
			d, err := time.ParseDuration(node.Resolver.ConnectTimeout)
			if err != nil {
				return Chain{}, fmt.Errorf("resolver %s: connect timeout %q: %w", n, node.Resolver.ConnectTimeout, err)
			}
			res.ConnectTimeout = d
		}
		if node.Resolver.Failover != nil {
			for _, t := range node.Resolver.Failover.Targets {
				res.Failover = append(res.Failover, targetService(t))
			}
		}
		ch.Resolvers[res.Service] = res
	}

	// Walk from the start node: a router's catch-all leads to the splitter
	// plain requests take; a chain may also start at the splitter.
	splitter := ""
	start := rc.Nodes[rc.StartNode]
	if start == nil {
		return Chain{}, fmt.Errorf("start node %q is not among the nodes", rc.StartNode)
	}
	switch start.Type {
	case "router":
		for _, r := range start.Routes {
			cr := ChainRoute{}
			if m := r.Definition.Match; m != nil && m.HTTP != nil {
				cr.PathPrefix = m.HTTP.PathPrefix
				if len(m.HTTP.Header) > 0 {
					cr.Header, cr.Exact = m.HTTP.Header[0].Name, m.HTTP.Header[0].Exact
				}
			}
			if d := r.Definition.Destination; d != nil {
				cr.Service = d.Service
				if d.RequestHeaders != nil {
					cr.SetHeaders = d.RequestHeaders.Set
				}
			}
			if next := rc.Nodes[r.NextNode]; next != nil && next.Type == "splitter" {
				cr.ToSplitter = true
				if cr.Header == "" && splitter == "" {
					splitter = r.NextNode
				}
			}
			ch.Routes = append(ch.Routes, cr)
		}
	case "splitter":
		splitter = rc.StartNode
	}
	if node := rc.Nodes[splitter]; node != nil {
		for _, s := range node.Splits {
			cs := ChainSplit{Service: s.Definition.Service, Weight: s.Weight}
			if cs.Service == "" {
				if next := rc.Nodes[s.NextNode]; next != nil && next.Resolver != nil {
					cs.Service = targetService(next.Resolver.Target)
				}
			}
			if s.Definition.RequestHeaders != nil {
				cs.SetHeaders = s.Definition.RequestHeaders.Set
			}
			ch.Splits = append(ch.Splits, cs)
		}
	}
	return ch, nil
}
