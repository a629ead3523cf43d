package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Fabio (https://fabiolb.net) is a Consul-catalog HTTP ingress: it builds
// its route table from the tags of passing service instances
// ("urlprefix-<host>/<path>") and reads no config entries, so it only
// reaches a revision at zero through the activator's stand-in instance.

// FabioConfig is how scenario 12 runs Fabio.
type FabioConfig struct {
	// Proxy and UI are host:port listen addresses (the UI serves the
	// /api/routes JSON and /health).
	Proxy, UI string
	// Consul is CONSUL_HTTP_ADDR as the suite has it: host:port or a URL.
	Consul string
	// Token is CONSUL_HTTP_TOKEN (empty: none).
	Token string
	// TLS, when set, is the CA and the client certificate Fabio shows a
	// Consul with mutual TLS on HTTPS (Consul is then an https:// URL).
	TLS TLSFiles
}

// FabioAccessLogFormat is the access log Fabio writes to its output: which
// upstream answered each request, for the test's failure output.
const FabioAccessLogFormat = "$time_rfc3339_ms access $request_host $request_uri $response_status $upstream_addr $response_time_ms"

// Args are Fabio's command-line flags.
//
//   - Fabio does not register itself in Consul: the scenario's catalog holds
//     only what nomad-serverless puts there.
//   - pollinterval 0 makes Fabio watch /v1/health/state/any with blocking
//     queries, so a route changes as soon as Consul's health does, not on a
//     poll tick.
//   - checksRequired all routes an instance only while every one of its
//     checks passes (the sidecar's readiness check fails when it drains),
//     not as soon as any one does.
//   - serviceMonitors 4 reads the catalog of changed services in parallel,
//     so other scenarios' services in the catalog do not delay ours.
//   - noroutestatus 404 is Fabio's default, spelled out because the
//     scenario asserts it after delete.
func (c FabioConfig) Args() []string {
	args := []string{
		"-proxy.addr", c.Proxy,
		"-ui.addr", c.UI,
		"-ui.access", "ro",
		"-registry.backend", "consul",
		"-registry.consul.addr", ConsulRegistryAddr(c.Consul),
		"-registry.consul.register.enabled=false",
		"-registry.consul.pollinterval", "0s",
		"-registry.consul.checksRequired", "all",
		"-registry.consul.serviceMonitors", "4",
		"-registry.timeout", "30s",
		"-proxy.noroutestatus", "404",
		"-log.routes.format", "delta",
		"-log.access.target", "stdout",
		"-log.access.format", FabioAccessLogFormat,
	}
	if c.Token != "" {
		args = append(args, "-registry.consul.token", c.Token)
	}
	if c.TLS.CA != "" {
		args = append(args, "-registry.consul.tls.cafile", c.TLS.CA)
	}
	if c.TLS.Cert != "" {
		args = append(args, "-registry.consul.tls.certfile", c.TLS.Cert, "-registry.consul.tls.keyfile", c.TLS.Key)
	}
	return args
}

// ConsulRegistryAddr is the -registry.consul.addr value for a
// CONSUL_HTTP_ADDR: host:port for plain HTTP (Fabio's default scheme), the
// URL kept for https (Fabio reads the scheme from it).
func ConsulRegistryAddr(addr string) string {
	addr = strings.TrimSpace(addr)
	if rest, ok := strings.CutPrefix(addr, "http://"); ok {
		addr = rest
	}
	return strings.TrimSuffix(addr, "/")
}

// FabioRoute is one row of Fabio's GET /api/routes.
type FabioRoute struct {
	Service string  `json:"service"`
	Host    string  `json:"host"`
	Path    string  `json:"path"`
	Src     string  `json:"src"`
	Dst     string  `json:"dst"`
	Opts    string  `json:"opts"`
	Weight  float64 `json:"weight"`
}

// String is "service host/path -> dst" for messages.
func (r FabioRoute) String() string {
	return fmt.Sprintf("%s %s%s -> %s", r.Service, r.Host, r.Path, r.Dst)
}

// FabioRoutesFor are the routes of a host (Fabio keeps hosts lowercase).
func FabioRoutesFor(routes []FabioRoute, host string) []FabioRoute {
	var out []FabioRoute
	for _, r := range routes {
		if strings.EqualFold(r.Host, host) {
			out = append(out, r)
		}
	}
	return out
}

// DstPort is the port of a route's target URL ("http://127.0.0.1:8080/"),
// 0 when it has none.
func (r FabioRoute) DstPort() int {
	rest := r.Dst
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	_, port, err := net.SplitHostPort(rest)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return 0
	}
	return n
}

// FabioURLPrefixTag is the tag that makes Fabio route host/ to an instance.
func FabioURLPrefixTag(host string) string { return "urlprefix-" + host + "/" }
