package devagents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Docker configures the docker driver of the Nomad dev agent StartDocker
// runs. Nomad enables the driver by default and finds dockerd at
// unix:///var/run/docker.sock; the fields are what a machine without a
// registry, or with its own dockerd, needs beyond that.
type Docker struct {
	// Endpoint is dockerd's API ("unix:///path/docker.sock"); "" is
	// Nomad's default, unix:///var/run/docker.sock.
	Endpoint string
	// CNIPath is the directory of the CNI plugins Nomad's bridge
	// networking runs (bridge, host-local, loopback, portmap, firewall);
	// "" is Nomad's default, /opt/cni/bin. Debian's
	// containernetworking-plugins package puts them in /usr/lib/cni.
	CNIPath string
	// InfraImage is the image of the pause container that holds a bridge
	// allocation's network namespace; "" is Nomad's default, pulled from
	// gcr.io. Nomad pulls it only if dockerd does not have it and its tag
	// is not "latest", so a locally built image works offline.
	InfraImage string
	// KeepImages turns Nomad's image garbage collection off (gc { image =
	// false }). With it on (the default), Nomad removes an image 3
	// minutes after the last container using it stopped: a revision at
	// zero for longer would need a pull to wake, and an image built on
	// the node, never pushed, would be gone for good.
	KeepImages bool
}

// NomadConfig renders the blocks a Nomad agent configuration gets for d:
// a client block with cni_path (if set) and the docker plugin block.
func (d Docker) NomadConfig() string {
	var b strings.Builder
	b.WriteString("\n# The docker driver (devagents.Docker).\n")
	if d.CNIPath != "" {
		fmt.Fprintf(&b, "client {\n  cni_path = %q\n}\n\n", d.CNIPath)
	}
	b.WriteString("plugin \"docker\" {\n  config {\n")
	if d.Endpoint != "" {
		fmt.Fprintf(&b, "    endpoint = %q\n", d.Endpoint)
	}
	if d.InfraImage != "" {
		fmt.Fprintf(&b, "    infra_image = %q\n", d.InfraImage)
	}
	if d.KeepImages {
		b.WriteString("    gc {\n      image = false\n    }\n")
	}
	b.WriteString("  }\n}\n")
	return b.String()
}

// StartDocker is Start for a Nomad agent whose docker driver is configured
// by d: the same configuration files plus d.NomadConfig(), the same waits,
// and one more before it returns: a ready client node whose docker driver
// is healthy (so dockerd must answer at d.Endpoint first). The ACL option
// is not supported here.
func StartDocker(ctx context.Context, o Options, d Docker) (a *Agents, err error) {
	if o.ConsulBin == "" || o.NomadBin == "" || o.Dir == "" {
		return nil, errors.New("start dev agents: ConsulBin, NomadBin and Dir are required")
	}
	if o.Config.ACL != nil {
		return nil, errors.New("start dev agents with docker: ACLs are not supported")
	}
	o = o.dockerDefaults()
	ports, err := o.Ports.FillFree()
	if err != nil {
		return nil, err
	}
	a = &Agents{
		Ports:      ports,
		NomadAddr:  "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP),
		ConsulAddr: "127.0.0.1:" + strconv.Itoa(ports.ConsulHTTP),
		progress:   o.Progress,
		dir:        o.Dir,
	}
	a.ConsulURL = "http://" + a.ConsulAddr
	defer func() {
		if err != nil {
			a.Stop(o.StopGrace)
			a = nil
		}
	}()

	consulCfg := filepath.Join(o.Dir, "consul.hcl")
	nomadCfg := filepath.Join(o.Dir, "nomad.hcl")
	if err := os.WriteFile(consulCfg, []byte(ConsulConfig(ports, o.Config)), 0o644); err != nil {
		return a, fmt.Errorf("write %s: %w", consulCfg, err)
	}
	nomadText := NomadConfig(ports, filepath.Join(o.Dir, "nomad-data"), o.Config) + d.NomadConfig()
	if err := os.WriteFile(nomadCfg, []byte(nomadText), 0o644); err != nil {
		return a, fmt.Errorf("write %s: %w", nomadCfg, err)
	}
	consul := agentHTTP{base: a.ConsulURL, tokenHeader: "X-Consul-Token"}
	nomad := agentHTTP{base: a.NomadAddr, tokenHeader: "X-Nomad-Token"}

	env := ChildEnv(os.Environ())
	consulLog := filepath.Join(o.Dir, "consul.log")
	fmt.Fprintf(o.Progress, "Starting Consul dev agent (%s, log %s)...\n", o.ConsulBin, consulLog)
	if a.Consul, err = StartProc(Command{Name: "consul", Path: o.ConsulBin, Args: []string{"agent", "-dev", "-config-file", consulCfg}, Env: env, LogPath: consulLog}); err != nil {
		return a, err
	}
	o.Guard.StopFirst(a.Consul.Pid(), a.Consul.Name)
	if err := WaitFor(ctx, a.Consul, "Consul at "+a.ConsulURL, o.ReadyTimeout, o.Poll, consul.leaderIs(ports.consulLeader())); err != nil {
		return a, err
	}
	nomadLog := filepath.Join(o.Dir, "nomad.log")
	fmt.Fprintf(o.Progress, "Starting Nomad dev agent with the docker driver (%s, log %s)...\n", o.NomadBin, nomadLog)
	if a.Nomad, err = StartProc(Command{Name: "nomad", Path: o.NomadBin, Args: []string{"agent", "-dev", "-config", nomadCfg}, Env: env, LogPath: nomadLog}); err != nil {
		return a, err
	}
	o.Guard.StopFirst(a.Nomad.Pid(), a.Nomad.Name)
	what := "Nomad at " + a.NomadAddr
	if err := WaitFor(ctx, a.Nomad, what, o.ReadyTimeout, o.Poll, nomad.leaderIs(ports.nomadLeader())); err != nil {
		return a, err
	}
	if err := WaitFor(ctx, a.Nomad, what, o.ReadyTimeout, o.Poll, nomad.rawExecNodeCheck); err != nil {
		return a, err
	}
	if err := WaitFor(ctx, a.Nomad, what, o.ReadyTimeout, o.Poll, nomad.dockerNodeCheck); err != nil {
		return a, err
	}
	return a, nil
}

// dockerDefaults fills the zero bounds as Start does.
func (o Options) dockerDefaults() Options {
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 90 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 200 * time.Millisecond
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// dockerNodeCheck passes once Nomad has a ready client node whose docker
// driver is detected and healthy; its error carries the driver's own
// health description ("Failed to connect to docker daemon", say).
func (a agentHTTP) dockerNodeCheck(ctx context.Context) error {
	var stubs []struct{ ID string }
	if err := a.do(ctx, http.MethodGet, "/v1/nodes", &stubs); err != nil {
		return err
	}
	var seen []string
	for _, s := range stubs {
		var n struct {
			Status  string
			Drivers map[string]struct {
				Detected, Healthy bool
				HealthDescription string
			}
		}
		if err := a.do(ctx, http.MethodGet, "/v1/node/"+s.ID, &n); err != nil {
			return err
		}
		d, ok := n.Drivers["docker"]
		if n.Status == "ready" && ok && d.Detected && d.Healthy {
			return nil
		}
		seen = append(seen, fmt.Sprintf("node %.8s %s: docker detected=%v healthy=%v %q", s.ID, n.Status, d.Detected, d.Healthy, d.HealthDescription))
	}
	return fmt.Errorf("no ready client node with a healthy docker driver: %s", strings.Join(seen, "; "))
}
