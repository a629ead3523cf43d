package e2e

import (
	"sort"
	"strings"

	consul "github.com/hashicorp/consul/api"
)

// ChainSummary is what a compiled discovery chain does with a service's
// requests, by service name rather than Consul's opaque node names.
type ChainSummary struct {
	// Splits maps each revision plain requests reach to its weight.
	Splits map[string]float32
	// Tags maps a tag (X-Serverless-Tag header value) to the revision its
	// route goes to.
	Tags map[string]string
	// Failover maps each resolved revision to the services its resolver
	// fails over to, in order.
	Failover map[string][]string
}

// SummarizeChain walks a compiled chain from its start node.
func SummarizeChain(c *consul.CompiledDiscoveryChain) ChainSummary {
	s := ChainSummary{Splits: map[string]float32{}, Tags: map[string]string{}, Failover: map[string][]string{}}
	if c == nil {
		return s
	}
	service := func(target string) string {
		if t := c.Targets[target]; t != nil && t.Service != "" {
			return t.Service
		}
		name, _, _ := strings.Cut(target, ".")
		return name
	}
	// resolved returns the revision a node ends at (resolver nodes only).
	resolved := func(node string) (string, bool) {
		n := c.Nodes[node]
		if n == nil || n.Type != "resolver" || n.Resolver == nil {
			return "", false
		}
		return service(n.Resolver.Target), true
	}
	splitter := func(node string) {
		n := c.Nodes[node]
		if n == nil || n.Type != "splitter" {
			return
		}
		for _, sp := range n.Splits {
			if rev, ok := resolved(sp.NextNode); ok {
				s.Splits[rev] += sp.Weight
			}
		}
	}
	switch start := c.Nodes[c.StartNode]; {
	case start == nil:
	case start.Type == "router":
		for _, r := range start.Routes {
			var tag string
			if d := r.Definition; d != nil && d.Match != nil && d.Match.HTTP != nil {
				for _, h := range d.Match.HTTP.Header {
					if h.Name == "X-Serverless-Tag" && h.Exact != "" {
						tag = h.Exact
					}
				}
			}
			if tag != "" {
				if rev, ok := resolved(r.NextNode); ok {
					s.Tags[tag] = rev
				}
				continue
			}
			if len(s.Splits) == 0 {
				splitter(r.NextNode)
				if rev, ok := resolved(r.NextNode); ok && len(s.Splits) == 0 {
					s.Splits[rev] = 100
				}
			}
		}
	case start.Type == "splitter":
		splitter(c.StartNode)
	case start.Type == "resolver":
		if rev, ok := resolved(c.StartNode); ok {
			s.Splits[rev] = 100
		}
	}
	names := make([]string, 0, len(c.Nodes))
	for n := range c.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		node := c.Nodes[n]
		if node.Type != "resolver" || node.Resolver == nil || node.Resolver.Failover == nil {
			continue
		}
		rev := service(node.Resolver.Target)
		for _, t := range node.Resolver.Failover.Targets {
			s.Failover[rev] = append(s.Failover[rev], service(t))
		}
	}
	return s
}
