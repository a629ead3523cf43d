package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/adminauth"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/certs"
)

// adminKeys is what a replica needs to talk to other replicas' admin API and
// to be talked to: the keyring read from Consul (kept current by follow),
// a verifier for the writes it serves, and a client that signs what it
// sends.
type adminKeys struct {
	ring     *adminauth.Ring
	verifier *adminauth.Verifier
	client   *http.Client
}

// adminKeysStartTimeout bounds the first read (or creation) of the keyring:
// serve cannot take or send a write without it, so it says why it cannot
// start rather than hang on an unresponsive Consul.
const adminKeysStartTimeout = 30 * time.Second

// keyringSource is what newAdminKeys needs of Consul; *consulroute.Client
// has it.
type keyringSource interface {
	AdminKeys(ctx context.Context) (*adminauth.Keyring, uint64, error)
	WatchAdminKeys(ctx context.Context, set func(*adminauth.Keyring)) error
}

// newAdminKeys reads the admin API's keyring from Consul, creating it if this
// is the first replica ever, and builds the verifier and signing client
// around it.
func newAdminKeys(ctx context.Context, src keyringSource, log *slog.Logger, reg prometheus.Registerer) (*adminKeys, error) {
	rctx, cancel := context.WithTimeout(ctx, adminKeysStartTimeout)
	defer cancel()
	kr, _, err := src.AdminKeys(rctx)
	if err != nil {
		return nil, fmt.Errorf("sign and verify admin API writes between replicas: %w", err)
	}
	ring := &adminauth.Ring{}
	ring.Set(kr)
	v, err := adminauth.NewVerifier(adminauth.VerifierConfig{Keys: ring, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	tr, err := adminauth.NewTransport(adminauth.TransportConfig{Keys: ring})
	if err != nil {
		return nil, err
	}
	// RemoteSink's calls are on the request path of a wake: short timeout.
	return &adminKeys{ring: ring, verifier: v, client: &http.Client{Timeout: 2 * time.Second, Transport: tr}}, nil
}

// follow keeps the keyring current (rotations, a deleted key recreated)
// until ctx ends.
func (k *adminKeys) follow(ctx context.Context, src keyringSource) error {
	return src.WatchAdminKeys(ctx, k.ring.Set)
}

// PprofPath is where the admin API serves the heap, allocs and goroutine
// profiles (PprofPath + "heap").
const PprofPath = "/debug/pprof/"

// adminHandler is the admin API: the gateway's health and metrics, the
// autoscaler's state and demand endpoints, and the gateway's routing state.
// Only the autoscaler's demand and wake change anything, and guard
// authenticates them; everything else is a read.
func adminHandler(gw *activator.Gateway, auto *autoscaler.Autoscaler, guard autoscaler.WriteGuard, certificates *certs.Manager) (http.Handler, error) {
	if gw == nil || auto == nil {
		return nil, errors.New("admin API: gateway and autoscaler are required")
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	base := echo.WrapHandler(gw.AdminHandler())
	e.GET(activator.HealthPath, base)
	e.GET(activator.MetricsPath, base)
	if err := autoscaler.RegisterAdmin(e, auto, guard); err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	e.GET("/v1/activator/revisions", func(c echo.Context) error { return c.JSON(http.StatusOK, gw.Revisions()) })
	// The heap and the goroutines, as net/http/pprof gives them: reads like
	// /metrics, cheap, and what tells a leak's cause (the soak takes one
	// at its start and end of each replica and compares them). No CPU
	// profile or trace: they hold a core for as long as the caller asks.
	for _, name := range []string{"heap", "allocs", "goroutine"} {
		e.GET(PprofPath+name, echo.WrapHandler(pprof.Handler(name)))
	}
	// Each routed name's certificate as this replica serves it (its
	// issuer and validity, and its own last ACME failure): `status` reads
	// every replica's. No private key, nothing that changes anything.
	e.GET(certs.AdminPath, func(c echo.Context) error {
		out := []certs.NameStatus{}
		if certificates != nil {
			out = certificates.Status()
		}
		return c.JSON(http.StatusOK, out)
	})
	return e, nil
}
