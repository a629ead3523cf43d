package devagents

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// InstallURL is where the agent binary name ("nomad" or "consul") comes
// from.
func InstallURL(name string) string {
	return "https://developer.hashicorp.com/" + name + "/install"
}

// LookPath finds an executable name in the directories of a PATH value, as
// exec.LookPath does with the process's own PATH (callers pass theirs so
// tests can point it at fakes).
func LookPath(name, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// ClusterVar reports whether an environment variable configures a Nomad or
// Consul client (NOMAD_*, CONSUL_*): such a setting points at another
// cluster, and a token, namespace, region or CA file of the user's would
// break the dev agents. NOMAD_SERVERLESS_* configure this project's binary
// and are not cluster settings.
func ClusterVar(name string) bool {
	return (strings.HasPrefix(name, "NOMAD_") || strings.HasPrefix(name, "CONSUL_")) && !strings.HasPrefix(name, "NOMAD_SERVERLESS_")
}

// ChildEnv is an environment for processes talking to dev agents: environ
// without its ClusterVar settings.
func ChildEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); !ClusterVar(name) {
			out = append(out, kv)
		}
	}
	return out
}

// PointProcessAt makes this process's Nomad and Consul clients (the APIs'
// DefaultConfig reads the environment) and the children it starts talk to
// the agents at nomadAddr and consulAddr and nothing else: every ClusterVar
// setting (a token, namespace, region or CA file of the user's own cluster)
// is removed, then NOMAD_ADDR and CONSUL_HTTP_ADDR are set. Only a process
// that owns its environment (a command, a test binary) may call it.
func PointProcessAt(nomadAddr, consulAddr string) error {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); ClusterVar(name) {
			if err := os.Unsetenv(name); err != nil {
				return fmt.Errorf("unset %s: %w", name, err)
			}
		}
	}
	if err := os.Setenv("NOMAD_ADDR", nomadAddr); err != nil {
		return fmt.Errorf("set NOMAD_ADDR: %w", err)
	}
	if err := os.Setenv("CONSUL_HTTP_ADDR", consulAddr); err != nil {
		return fmt.Errorf("set CONSUL_HTTP_ADDR: %w", err)
	}
	return nil
}
