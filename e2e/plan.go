package e2e

import (
	"fmt"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// Mode is where the suite gets its agents from.
type Mode int

const (
	// Skip: no agents and no way to start them.
	Skip Mode = iota
	// UseRunning: NOMAD_ADDR and CONSUL_HTTP_ADDR name running agents.
	UseRunning
	// StartAgents: consul and nomad are on PATH, or NOMAD_BIN and
	// CONSUL_BIN name them; the suite starts dev agents.
	StartAgents
	// Misconfigured: only one of NOMAD_ADDR and CONSUL_HTTP_ADDR is set.
	Misconfigured
	// Rehearse: -rehearse was given; the scenarios run against
	// test/fakecluster, a stand-in for Nomad and Consul that runs
	// raw_exec allocations as real processes. It checks the suite and the
	// wiring where no agents can be installed; it is not an end-to-end pass.
	Rehearse
)

// Plan is the decision TestMain acts on.
type Plan struct {
	Mode                  Mode
	NomadAddr, ConsulAddr string // UseRunning
	NomadBin, ConsulBin   string // StartAgents
	// Reason says why (Skip, Misconfigured).
	Reason string
}

// Decide picks the agents' source from the environment and PATH. lookPath is
// exec.LookPath in the suite. NOMAD_BIN and CONSUL_BIN, when set, name the
// binaries to start instead of PATH's (one pair of agents beside another:
// the oldest supported and the newest); a path that is not an executable
// is a misconfiguration, not a skip.
func Decide(getenv func(string) string, lookPath func(string) (string, error)) Plan {
	nomadAddr, consulAddr := getenv("NOMAD_ADDR"), getenv("CONSUL_HTTP_ADDR")
	switch {
	case nomadAddr != "" && consulAddr != "":
		return Plan{Mode: UseRunning, NomadAddr: nomadAddr, ConsulAddr: consulAddr}
	case nomadAddr != "":
		return Plan{Mode: Misconfigured, Reason: "NOMAD_ADDR is set but CONSUL_HTTP_ADDR is not: set both to use running agents, or neither to let the suite start dev agents"}
	case consulAddr != "":
		return Plan{Mode: Misconfigured, Reason: "CONSUL_HTTP_ADDR is set but NOMAD_ADDR is not: set both to use running agents, or neither to let the suite start dev agents"}
	}
	nomadBin, nerr := agentBinary(getenv, lookPath, "NOMAD_BIN", "nomad")
	consulBin, cerr := agentBinary(getenv, lookPath, "CONSUL_BIN", "consul")
	for _, m := range []struct {
		env string
		err error
	}{{"NOMAD_BIN", nerr}, {"CONSUL_BIN", cerr}} {
		if m.err != nil && getenv(m.env) != "" {
			return Plan{Mode: Misconfigured, Reason: fmt.Sprintf("%s=%s: %v", m.env, getenv(m.env), m.err)}
		}
	}
	if nerr == nil && cerr == nil {
		return Plan{Mode: StartAgents, NomadBin: nomadBin, ConsulBin: consulBin}
	}
	var missing, urls []string
	for _, m := range []struct {
		name string
		err  error
	}{{"nomad", nerr}, {"consul", cerr}} {
		if m.err != nil {
			missing = append(missing, m.name)
			urls = append(urls, devagents.InstallURL(m.name))
		}
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return Plan{Mode: Skip, Reason: fmt.Sprintf("%s %s not on PATH and NOMAD_ADDR/CONSUL_HTTP_ADDR are not set (install from %s)",
		strings.Join(missing, " and "), verb, strings.Join(urls, " and "))}
}

// agentBinary is the agent binary env names, or name on PATH.
func agentBinary(getenv func(string) string, lookPath func(string) (string, error), env, name string) (string, error) {
	if p := getenv(env); p != "" {
		return lookPath(p)
	}
	return lookPath(name)
}

// SkipLine is the one line the suite prints when it does not run.
func (p Plan) SkipLine() string {
	switch p.Mode {
	case Skip:
		return "e2e: SKIPPED: " + p.Reason
	case Misconfigured:
		return "e2e: NOT RUN: " + p.Reason
	}
	return ""
}
