package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Service is a test service: the binary under test's `testapp` (or the
// gRPC test app) run by raw_exec, with scaling shortened so a scenario sees
// it react within seconds. HCL renders it in the language of `deploy` (see
// examples/).
type Service struct {
	Name string
	// Binary is the absolute path of nomad-serverless on the (local) node.
	Binary string
	// Env is the app's environment: TESTAPP_READY_DELAY, TESTAPP_SLEEP,
	// TESTAPP_NAME (which the app echoes in X-Testapp-Name, so a client
	// sees which revision answered; changing it makes a new revision).
	Env         map[string]string
	Concurrency int
	Scaling     Scaling
	Traffic     []Traffic
	// Tags go on each revision's Consul service (and the activator's
	// stand-in); Domains are extra hosts the gateway serves.
	Tags, Domains []string
	// HostNetwork, when set, is the network block's host_network: the
	// clients' host network the instances' ports get their address from.
	HostNetwork string
	// Visibility, when set, is the service's visibility ("internal":
	// served on the gateways' internal listener only).
	Visibility string
	// HTTPSRedirect writes https { redirect = true }.
	HTTPSRedirect bool
	// GRPC, when set, says Binary is the gRPC test app (test/grpcapp, a
	// plain grpc-go server): run without arguments, with the task's
	// protocol "h2c" and gRPC readiness.
	GRPC bool
	// Rollout, when set, is the body of the service's rollout block, as
	// HCL ("steps = [10, 50]\n analysis { ... }").
	Rollout string
	// CPU is the app's reserved cpu in MHz; 0 is 50.
	CPU int
}

// Scaling is the subset of the scaling block the scenarios set. Min and
// Initial are always written; other zero fields are left out (the service's
// defaults apply).
type Scaling struct {
	Min, Max, Initial int
	// Metric is the scaling metric ("" leaves the default, concurrency).
	Metric string
	// Target is concurrent requests per instance (or, with metric cpu or
	// memory, the percentage of the reservation).
	Target           float64
	Window           time.Duration
	ScaleToZeroGrace time.Duration
}

// Traffic is one traffic block.
type Traffic struct {
	Revision string
	Latest   bool
	Percent  int
	Tag      string
}

// FastScaling is what most scenarios use: a 6 s stable window, 2 s
// scale-to-zero grace, 5 concurrent requests per instance, up to 5
// instances.
func FastScaling() Scaling {
	return Scaling{Min: 0, Max: 5, Initial: 1, Target: 5, Window: 6 * time.Second, ScaleToZeroGrace: 2 * time.Second}
}

func hclDuration(d time.Duration) string {
	// Go's duration syntax is what the service language reads ("6s",
	// "1.5s", "250ms").
	return d.String()
}

// HCL renders the service block.
func (s Service) HCL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "service %q {\n", s.Name)
	b.WriteString("  task {\n")
	b.WriteString("    driver = \"raw_exec\"\n")
	b.WriteString("    config {\n")
	fmt.Fprintf(&b, "      command = %q\n", s.Binary)
	if !s.GRPC {
		b.WriteString("      args    = [\"testapp\"]\n")
	}
	b.WriteString("    }\n")
	if s.GRPC {
		b.WriteString("    protocol = \"h2c\"\n")
	}
	if len(s.Env) > 0 {
		b.WriteString("    env {\n")
		keys := make([]string, 0, len(s.Env))
		for k := range s.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "      %s = %q\n", k, s.Env[k])
		}
		b.WriteString("    }\n")
	}
	// Small reservations: a 2-core node runs a few dozen of them.
	cpu := s.CPU
	if cpu == 0 {
		cpu = 50
	}
	fmt.Fprintf(&b, "    resources {\n      cpu    = %d\n      memory = 64\n    }\n", cpu)
	b.WriteString("    kill_timeout = \"5s\"\n")
	b.WriteString("  }\n\n")
	if s.GRPC {
		// The standard health service, over h2c.
		b.WriteString("  readiness {\n    grpc {}\n  }\n\n")
	} else {
		// Readiness on the app's /ready, so TESTAPP_READY_DELAY is what
		// the sidecar waits for.
		b.WriteString("  readiness {\n    http {\n      path = \"/ready\"\n    }\n  }\n\n")
	}
	if s.Concurrency > 0 {
		fmt.Fprintf(&b, "  concurrency = %d\n\n", s.Concurrency)
	}
	if s.HostNetwork != "" {
		fmt.Fprintf(&b, "  network {\n    host_network = %q\n  }\n\n", s.HostNetwork)
	}
	sc := s.Scaling
	b.WriteString("  scaling {\n")
	fmt.Fprintf(&b, "    min = %d\n", sc.Min)
	if sc.Max > 0 {
		fmt.Fprintf(&b, "    max = %d\n", sc.Max)
	}
	fmt.Fprintf(&b, "    initial = %d\n", sc.Initial)
	if sc.Metric != "" {
		fmt.Fprintf(&b, "    metric = %q\n", sc.Metric)
	}
	if sc.Target > 0 {
		fmt.Fprintf(&b, "    target = %g\n", sc.Target)
	}
	if sc.Window > 0 {
		fmt.Fprintf(&b, "    window = %q\n", hclDuration(sc.Window))
	}
	if sc.ScaleToZeroGrace > 0 {
		fmt.Fprintf(&b, "    scale_to_zero_grace = %q\n", hclDuration(sc.ScaleToZeroGrace))
	}
	b.WriteString("  }\n")
	if s.Visibility != "" {
		fmt.Fprintf(&b, "\n  visibility = %q\n", s.Visibility)
	}
	if s.HTTPSRedirect {
		b.WriteString("\n  https {\n    redirect = true\n  }\n")
	}
	if len(s.Tags)+len(s.Domains) > 0 {
		b.WriteString("\n")
	}
	for _, l := range []struct {
		name string
		vals []string
	}{{"tags", s.Tags}, {"domains", s.Domains}} {
		if len(l.vals) == 0 {
			continue
		}
		q := make([]string, len(l.vals))
		for i, v := range l.vals {
			q[i] = strconv.Quote(v)
		}
		fmt.Fprintf(&b, "  %s = [%s]\n", l.name, strings.Join(q, ", "))
	}
	if s.Rollout != "" {
		fmt.Fprintf(&b, "\n  rollout {\n%s\n  }\n", s.Rollout)
	}
	for _, t := range s.Traffic {
		b.WriteString("\n  traffic {\n")
		if t.Latest {
			b.WriteString("    latest  = true\n")
		} else {
			fmt.Fprintf(&b, "    revision = %q\n", t.Revision)
		}
		fmt.Fprintf(&b, "    percent = %d\n", t.Percent)
		if t.Tag != "" {
			fmt.Fprintf(&b, "    tag     = %q\n", t.Tag)
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// WriteServiceFile writes services into dir/name and returns the path.
func WriteServiceFile(dir, name string, services ...Service) (string, error) {
	var parts []string
	for _, s := range services {
		parts = append(parts, s.HCL())
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("# written by the e2e suite\n\n"+strings.Join(parts, "\n")), 0o644); err != nil {
		return "", err
	}
	return path, nil
}
