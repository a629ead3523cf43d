package controlplane

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// HTTPS configures the gateway's HTTPS port. Certificates come from Files
// first, then from the operator's certificates in Consul KV
// (consulroute.TLSSecretsPrefix), then, when ACME is set, from the ACME
// directory for every other routed name.
type HTTPS struct {
	// Listen is the HTTPS port's address; "" serves no HTTPS.
	Listen string
	Files  []certs.FilePair
	// ACME's ports (challenges) are filled in from the listeners.
	ACME *certs.ACME
}

// newCertificates builds the certificate manager for the listeners ls
// opened; nil when there is no HTTPS port.
func newCertificates(c Config, consul *consulroute.Client, ls *listeners, reg prometheus.Registerer, log *slog.Logger) (*certs.Manager, error) {
	if ls.https == nil {
		return nil, nil
	}
	var acme *certs.ACME
	if c.HTTPS.ACME != nil {
		a := *c.HTTPS.ACME
		// The CA validates on the gateway's own ports: HTTP-01 on the plain
		// one (never redirected), TLS-ALPN-01 on the HTTPS one.
		a.HTTPPort, a.TLSPort = ls.gatewayPort(), ls.httpsPort()
		a.ListenHost, _, _ = net.SplitHostPort(c.HTTPS.Listen)
		acme = &a
	}
	return certs.New(certs.Config{
		Consul: consul, Replica: c.Replica, Files: c.HTTPS.Files, ACME: acme,
		Logger: log, Registerer: reg,
	})
}

// certificateNamesEvery bounds how stale the names handed to the
// certificate manager may be; a catalog change hands them sooner.
const certificateNamesEvery = 10 * time.Second

// followCertificateNames gives m the names gw routes, whenever the catalog
// changes (once the gateway had a moment to rebuild its table from it),
// until ctx ends.
func followCertificateNames(ctx context.Context, cat *catalog.Catalog, gw *activator.Gateway, m *certs.Manager) {
	var last []activator.Host
	tick := time.NewTicker(certificateNamesEvery)
	defer tick.Stop()
	for {
		changed := cat.Changed()
		if hosts := gw.Hosts(); !slices.Equal(hosts, last) {
			last = hosts
			names := make([]certs.Name, len(hosts))
			for i, h := range hosts {
				names[i] = certs.Name{Host: h.Host, Service: h.Service, Namespace: h.Namespace, Internal: h.Internal}
			}
			m.SetNames(names)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
			// The gateway rebuilds its table on the same signal.
			select {
			case <-ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}
