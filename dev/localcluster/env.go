package localcluster

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// readyPath is the test app's readiness endpoint.
const readyPath = "/ready"

// appEnv is the test app's environment, as Nomad would give the user task.
func (a App) appEnv(rev catalog.Revision, port int) map[string]string {
	env := map[string]string{
		spec.EnvPort:     strconv.Itoa(port),
		spec.EnvKService: rev.Service,
		spec.EnvRevision: rev.Name,
	}
	if a.StartDelay > 0 {
		env[testapp.EnvStartDelay] = a.StartDelay.String()
	}
	if a.ReadyDelay > 0 {
		env[testapp.EnvReadyDelay] = a.ReadyDelay.String()
	}
	if a.Sleep > 0 {
		env[testapp.EnvSleep] = a.Sleep.String()
	}
	if a.CPU > 0 {
		env[testapp.EnvCPU] = a.CPU.String()
	}
	if a.Name != "" {
		env[testapp.EnvName] = a.Name
	}
	for k, v := range a.Env {
		env[k] = v
	}
	return env
}

// sidecarEnv is the sidecar's environment, built from the same
// spec.SidecarConfig the job compiler uses.
func (a App) sidecarEnv(rev catalog.Revision, alloc string, port, appPort, adminPort int) map[string]string {
	depth := a.QueueDepth
	if depth == 0 {
		depth = rev.Concurrency * spec.DefaultQueueDepthFactor
	}
	cfg := spec.SidecarConfig{
		Service:      rev.Service,
		Revision:     rev.Name,
		Instance:     alloc,
		AppProtocol:  a.Protocol,
		Concurrency:  rev.Concurrency,
		QueueDepth:   depth,
		Timeout:      rev.Timeout,
		Readiness:    a.readiness(),
		DrainGrace:   a.DrainGrace,
		DrainTimeout: a.DrainTimeout,
	}
	env := cfg.Env()
	env[spec.EnvSidecarPort] = strconv.Itoa(port)
	env[spec.EnvSidecarAppPort] = strconv.Itoa(appPort)
	env[spec.EnvSidecarAdminPort] = strconv.Itoa(adminPort)
	for k, v := range a.SidecarEnv {
		env[k] = v
	}
	return env
}

// mergeEnv returns base with every key of over replaced or added, so a
// variable set in the test's own environment never leaks into a child.
func mergeEnv(base []string, over map[string]string) []string {
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := over[k]; ok {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range over {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// readiness is the sidecar's probe of the app: the declared one, or the test
// app's /ready endpoint probed aggressively (period 0), so ReadyDelay and
// POST /fail-ready are seen by the sidecar and so by the checks.
func (a App) readiness() *spec.Probe {
	if a.Readiness != nil {
		return a.Readiness
	}
	p := spec.DefaultProbe(spec.ProbeHTTP)
	p.Path = readyPath
	return &p
}
