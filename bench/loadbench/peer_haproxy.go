package main

import (
	"fmt"
	"strings"
)

// haproxyPeer is HAProxy as a production load balancer would run it for
// this: two threads (one a core), HTTP mode, keep-alive on both sides and
// `http-reuse always`, so every request reuses an idle connection to the
// app as our proxies do.
func haproxyPeer() peerKind {
	return peerKind{
		Name:       "haproxy",
		Bin:        "haproxy",
		Package:    "haproxy",
		ConfigFile: "haproxy.cfg",
		Config:     haproxyConfig,
		// -db: foreground, no daemon, so stopping the process stops it.
		Args: func(_, path string) []string { return []string{"-db", "-f", path} },
	}
}

// haproxyConfig renders HAProxy's configuration. It writes no files (no
// log, no stats socket), so dir is unused.
func haproxyConfig(_, listen, upstream string) string {
	return fmt.Sprintf(`# Written by loadbench: a peer proxy in front of %[2]s.
global
	nbthread 2
	maxconn 4096

defaults
	mode http
	option http-keep-alive
	http-reuse always
	timeout connect 5s
	timeout client 60s
	timeout server 60s
	timeout http-keep-alive 60s

frontend bench
	bind %[1]s
	default_backend app

backend app
	server app %[2]s maxconn 1024
`, listen, upstream)
}

// haproxyH2CPeer is HAProxy for the gRPC benchmark: HTTP/2 with prior
// knowledge (h2c) on its listener and to the upstream (`proto h2` on the
// bind and server lines), as it is put in front of a gRPC service without
// TLS; otherwise configured as haproxyPeer (streams to the upstream are
// multiplexed over its kept connections: http-reuse always).
func haproxyH2CPeer() peerKind {
	k := haproxyPeer()
	k.Config = func(dir, listen, upstream string) string {
		return strings.Replace(strings.Replace(haproxyConfig(dir, listen, upstream),
			"bind "+listen, "bind "+listen+" proto h2", 1),
			"server app "+upstream, "server app "+upstream+" proto h2", 1)
	}
	return k
}
