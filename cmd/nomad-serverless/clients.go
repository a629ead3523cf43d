package main

import (
	"fmt"
	"os"
	"strings"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/install"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// newNomad returns a Nomad client configured as the nomad CLI is: NOMAD_ADDR,
// NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION and the TLS variables. policy
// is the ACL policy (install.Policy*) its errors tell the user to hold.
func newNomad(policy string) (*nomadjob.Client, error) {
	c, err := nomadjob.NewClient(nomadapi.DefaultConfig())
	if err != nil {
		return nil, fmt.Errorf("configure the Nomad client (NOMAD_ADDR and friends): %w", err)
	}
	c.SetPolicy(policy)
	return c, nil
}

// newConsul returns a Consul client configured as the consul CLI is:
// CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and the TLS variables. policy is the
// ACL policy (install.Policy*) its errors tell the user to hold.
func newConsul(policy string, opts ...consulroute.Option) (*consulroute.Client, error) {
	c, err := consulroute.NewClient(consulapi.DefaultConfig(), append([]consulroute.Option{consulroute.WithPolicy(policy)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("configure the Consul client (CONSUL_HTTP_ADDR and friends): %w", err)
	}
	return c, nil
}

// newClients are the Nomad and Consul clients of the deploy commands
// (deploy, traffic, status, list, delete) configured from the environment.
func newClients() (*nomadjob.Client, *consulroute.Client, error) {
	nomad, err := newNomad(install.PolicyDeploy)
	if err != nil {
		return nil, nil, err
	}
	consul, err := newConsul(install.PolicyDeploy)
	if err != nil {
		return nil, nil, err
	}
	return nomad, consul, nil
}

// isTerminal reports whether w is a terminal, for progress that rewrites one
// line instead of printing many.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// errorLine prints a failed command's error and returns exitError.
func errorLine(e *env, cmd string, err error) int {
	fmt.Fprintf(e.stderr, "nomad-serverless %s: %s\n", cmd, strings.TrimSpace(err.Error()))
	return exitError
}
