package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/controlplane"
	"github.com/nomad-serverless/nomad-serverless/install"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// serveOptions are `serve`'s flags.
type serveOptions struct {
	listen, adminListen string
	internalListen      string
	sockets             string
	advertise           string
	domain              string
	replica             string
	tick                time.Duration
	logJSON             bool
	https               httpsOptions
}

// httpsOptions are serve's HTTPS flags.
type httpsOptions struct {
	port                int
	portSet             bool
	certFiles, keyFiles []string
	acmeDirectory       string
	acmeEmail           string
	acmeCARoot          string
	acmeProfile         string
	acmeRenewCheck      time.Duration
	acmeChallenges      string
}

// on tells whether serve listens for HTTPS: when it has a certificate
// source of its own (files, ACME) or -https-port is given (certificates
// from Consul KV alone). Off otherwise, so replicas started side by side
// without HTTPS do not fight over its default port.
func (h httpsOptions) on() bool {
	return h.port != 0 && (h.portSet || len(h.certFiles) > 0 || h.acmeEmail != "")
}

// config is the control plane's HTTPS configuration.
func (h httpsOptions) config(listen string) (controlplane.HTTPS, error) {
	if !h.on() {
		return controlplane.HTTPS{}, nil
	}
	if len(h.certFiles) != len(h.keyFiles) {
		return controlplane.HTTPS{}, fmt.Errorf("-tls-cert given %d times and -tls-key %d: give them in pairs, in the same order", len(h.certFiles), len(h.keyFiles))
	}
	if h.port < 0 || h.port > 65535 {
		return controlplane.HTTPS{}, fmt.Errorf("-https-port %d is not a port", h.port)
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return controlplane.HTTPS{}, fmt.Errorf("-listen %q: %w", listen, err)
	}
	out := controlplane.HTTPS{Listen: net.JoinHostPort(host, strconv.Itoa(h.port))}
	for i := range h.certFiles {
		out.Files = append(out.Files, certs.FilePair{Cert: h.certFiles[i], Key: h.keyFiles[i]})
	}
	if h.acmeEmail != "" {
		a := &certs.ACME{Directory: h.acmeDirectory, Email: h.acmeEmail, Profile: h.acmeProfile, RenewCheckInterval: h.acmeRenewCheck,
			NoHTTP01: true, NoTLSALPN01: true}
		for _, c := range strings.Split(h.acmeChallenges, ",") {
			switch strings.TrimSpace(c) {
			case "http-01":
				a.NoHTTP01 = false
			case "tls-alpn-01":
				a.NoTLSALPN01 = false
			case "":
			default:
				return controlplane.HTTPS{}, fmt.Errorf("-acme-challenges: unknown challenge type %q (want http-01, tls-alpn-01 or both)", c)
			}
		}
		if h.acmeCARoot != "" {
			pem, err := os.ReadFile(h.acmeCARoot)
			if err != nil {
				return controlplane.HTTPS{}, fmt.Errorf("-acme-ca-root: %w", err)
			}
			a.Roots = x509.NewCertPool()
			if !a.Roots.AppendCertsFromPEM(pem) {
				return controlplane.HTTPS{}, fmt.Errorf("-acme-ca-root %s: no PEM certificate in it", h.acmeCARoot)
			}
		}
		out.ACME = a
	} else if h.acmeCARoot != "" || h.acmeProfile != "" {
		return controlplane.HTTPS{}, errors.New("-acme-ca-root and -acme-profile go with -acme-email, which turns ACME on")
	}
	return out, nil
}

// addHTTPSFlags registers the HTTPS flags on fs.
func addHTTPSFlags(fs *flag.FlagSet, h *httpsOptions) {
	fs.IntVar(&h.port, "https-port", 8443, "`port` of the gateway's HTTPS listener, on the -listen host; it listens when -tls-cert or -acme-email is given, or this flag is (then with certificates from Consul KV under "+consulroute.TLSSecretsPrefix+")")
	fs.Func("tls-cert", "PEM certificate chain `file` (repeatable, paired in order with -tls-key); first in precedence, and the first answers clients that send no server name", func(s string) error {
		h.certFiles = append(h.certFiles, s)
		return nil
	})
	fs.Func("tls-key", "PEM private key `file` of the -tls-cert in the same position (repeatable)", func(s string) error {
		h.keyFiles = append(h.keyFiles, s)
		return nil
	})
	fs.StringVar(&h.acmeDirectory, "acme-directory", certs.LetsEncrypt, "ACME directory `URL` certificates are ordered from for every routed name nothing else covers (Let's Encrypt's staging: "+certs.LetsEncryptStaging+")")
	fs.StringVar(&h.acmeEmail, "acme-email", "", "the ACME account's contact `address`; setting it turns ACME on and agrees to the CA's terms")
	fs.StringVar(&h.acmeCARoot, "acme-ca-root", "", "PEM `file` of the CA that signed the ACME directory's own HTTPS certificate (a test CA such as Pebble); default: the system's roots")
	fs.StringVar(&h.acmeProfile, "acme-profile", "", "certificate `profile` to ask the ACME CA for (default: the CA's)")
	fs.StringVar(&h.acmeChallenges, "acme-challenges", "http-01,tls-alpn-01", "ACME challenge `types` to answer: HTTP-01 on the HTTP port (the CA asks port 80), TLS-ALPN-01 on the HTTPS port (the CA asks 443)")
	fs.DurationVar(&h.acmeRenewCheck, "acme-renew-check", certs.DefaultRenewCheckInterval, "how often certificates are checked for renewal (shorten only for certificates that live minutes)")
}

func runServe(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "serve", `Usage: nomad-serverless serve [options]

Runs the control plane: the gateway and activator on -listen (and HTTPS on
-https-port; internal services on -internal-listen only), the admin API (/healthz, /metrics, autoscaler state) on
-admin-listen, and, on the replica that holds the Consul lock, the autoscaler. Reads NOMAD_ADDR, CONSUL_HTTP_ADDR and tokens
from the environment. Run several replicas behind a load balancer for high availability.

`)
	host, _ := os.Hostname()
	var o serveOptions
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "`address` of the gateway (user traffic)")
	fs.StringVar(&o.sockets, "sockets", "", "unix socket `path` of a keep-sockets process holding the gateway's listening sockets (and HTTPS's and the internal listener's) for this serve; they then outlive a crash of serve (default: serve binds -listen itself)")
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:8081", "`address` of the admin API (health, metrics, autoscaler state)")
	fs.StringVar(&o.internalListen, "internal-listen", "", "`address` of the gateway's internal listener (plain HTTP and h2c), where internal services (visibility = \"internal\") are served beside public ones; bind it to the node's private address. Registered in Consul as "+spec.InternalServiceName+" (default: none; internal services are then reachable through the mesh only)")
	fs.StringVar(&o.advertise, "advertise", "", "`IP` other nodes reach this replica at (registered in Consul); default: the -listen host, or the Consul agent's address when that is a wildcard")
	fs.StringVar(&o.domain, "domain", activator.DefaultDomain, "services answer at <service>.<namespace>.`domain`")
	fs.StringVar(&o.replica, "replica", host, "this replica's `name` (unique among serve replicas)")
	fs.DurationVar(&o.tick, "tick", 2*time.Second, "the autoscaler's decision period")
	fs.BoolVar(&o.logJSON, "log-json", false, "log JSON lines instead of text")
	addHTTPSFlags(fs, &o.https)
	if _, err := parseFlagsAnywhere(fs, args); err != nil {
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) { o.https.portSet = o.https.portSet || f.Name == "https-port" })
	if o.replica == "" {
		fmt.Fprintln(e.stderr, "nomad-serverless serve: -replica is empty and the host name is unknown; name this replica")
		return exitUsage
	}
	var handler slog.Handler = slog.NewTextHandler(e.stderr, nil)
	if o.logJSON {
		handler = slog.NewJSONHandler(e.stderr, nil)
	}
	log := slog.New(handler).With("replica", o.replica)
	if err := serve(ctx, o, log); err != nil {
		return errorLine(e, "serve", err)
	}
	return exitOK
}

// serve builds the Nomad and Consul clients and runs the control plane
// until ctx ends.
func serve(ctx context.Context, o serveOptions, log *slog.Logger) error {
	https, err := o.https.config(o.listen)
	if err != nil {
		return err
	}
	nomad, err := newNomad(install.PolicyControlPlane)
	if err != nil {
		return err
	}
	nomad.SetLogger(log)
	consul, err := newConsul(install.PolicyControlPlane, consulroute.WithReplica(o.replica), consulroute.WithLogger(log))
	if err != nil {
		return err
	}
	tp, err := tracing.New(ctx, tracing.Options{ServiceName: "nomad-serverless", Logger: log,
		Attributes: []attribute.KeyValue{attribute.String("service.instance.id", o.replica)}})
	if err != nil {
		return err
	}
	if tp != nil {
		log.Info("tracing on: spans go to the OTLP endpoint of the OTEL_* environment")
		defer shutdownTracing(tp, log)
	}
	if err := consul.PutTracingSettings(ctx, tracing.ProcessSettings()); err != nil {
		// Revisions deployed from now on would miss the settings; serving
		// goes on.
		log.Warn("could not publish the tracing settings for revisions' sidecars", "err", err)
	}
	return controlplane.Run(ctx, controlplane.Config{
		Listen: o.listen, AdminListen: o.adminListen, InternalListen: o.internalListen, Sockets: o.sockets, Advertise: o.advertise,
		Domain: o.domain, Replica: o.replica, Tick: o.tick, HTTPS: https,
		Nomad: nomad, Consul: consul, Logger: log, Tracing: tp,
	})
}
