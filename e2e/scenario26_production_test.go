package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// Scenario 26: the production install on the newest pair (issue 33, parts 2
// and 3). A cluster of its own (prodcluster.go): a Consul server and a Nomad
// server, 3 nodes each with a Consul agent and a Nomad client, ACLs on with
// default deny in both, mutual TLS for both agents' HTTP and RPC with a CA
// the harness makes, Consul gossip encryption, and Nomad's workload
// identities wired to Consul as `nomad setup consul` wires them.
//
// After the agents are up, every step is one deploy/README.md tells a
// reader to take (scenario26_install_test.go): install -out, the policies
// and tokens, the control plane's Consul token and client certificate in
// its Variable, install -apply (docker, -nomad-auth identity, 3 replicas);
// then a deploy user holding only the deploy policies deploys, wakes a
// revision at zero through an installed gateway, splits traffic, reads
// status and logs and deletes; then Fabio in front, 8 connections of load
// through a rolling update of the control plane and a kill -9 of one
// replica; then the errors of part 3 of issue 33 (scenario26_errors_test.go):
// a wrong CA, a missing or expired token, a missing capability and a
// workload identity Consul refuses, each one message naming what to do.
func TestE2E26Production(t *testing.T) {
	h := newHarness(t, "26 production")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("e2e 26: SKIPPED: needs agents the suite starts itself (NOMAD_BIN/CONSUL_BIN or PATH): it starts a production cluster of its own")
	}
	nv, err := agentVersion(h.s.Plan.NomadBin, "Nomad")
	if err != nil {
		t.Fatal(err)
	}
	cv, err := agentVersion(h.s.Plan.ConsulBin, "Consul")
	if err != nil {
		t.Fatal(err)
	}
	if line := NewestPairSkip(nv, cv); line != "" {
		t.Skip(line)
	}

	// The control plane runs from the scratch image (deploy/README.md's
	// docker way), so the nodes need a dockerd.
	dplan := DecideDocker(os.Getenv, exec.LookPath, PingHost)
	if dplan.Skip != "" {
		t.Skip("e2e 26: " + dplan.Skip)
	}
	// Short: the task API sockets are below it (agentDir says why).
	dir := h.scratchDir("ns26-", "agent data and logs")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dockerHost, _ := h.dockerd(ctx, dplan, dir)
	dc := NewDockerClient(dockerHost)
	image, pauseImage := fmt.Sprintf("nomad-serverless:e2e26-%d", os.Getpid()), fmt.Sprintf("nomad-serverless-pause:e2e26-%d", os.Getpid())
	t.Cleanup(func() {
		for _, ref := range []string{image, pauseImage} {
			if err := dc.RemoveImage(context.Background(), ref); err != nil {
				t.Logf("remove image %s: %v", ref, err)
			}
		}
	})
	h.buildImages(dc, dir, image, pauseImage)

	start := time.Now()
	cl, err := StartProdCluster(ctx, ProdClusterOptions{
		ConsulBin: h.s.Plan.ConsulBin, NomadBin: h.s.Plan.NomadBin, Dir: dir, Nodes: 3,
		LogLevel: "DEBUG", ReadyTimeout: 2 * time.Minute, Progress: testWriter{t}, Guard: h.s.Guard,
		DockerEndpoint: dockerHost,
	})
	if err != nil {
		t.Fatalf("start the production cluster (Nomad %s, Consul %s): %v", nv, cv, err)
	}
	t.Cleanup(func() {
		if err := cl.PurgeJobs(time.Minute); err != nil {
			t.Errorf("production cluster: %v", err)
		}
		for _, line := range cl.Stop(agentStopGrace) {
			t.Errorf("production cluster stop: %s", line)
		}
	})
	h.timing(fmt.Sprintf("start the production cluster (Nomad %s, Consul %s, 3 nodes, ACL+mTLS+gossip)", nv, cv), time.Since(start))

	cc, err := cl.ConsulClient("")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cl.NomadClient("")
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := wireWorkloadIdentities(ctx, cl, cc); err != nil {
		t.Fatal(err)
	}
	h.timing("wire Nomad's workload identities to Consul (auth method, binding rules)", time.Since(start))

	// From here on the harness observes the production cluster with the
	// management tokens; the CLI runs with whatever tokens a step names.
	p := h.on(t)
	p.nomad, p.consul, p.serveConsul = nc, cc, cc
	op := prodOperator{t: t, h: p, cl: cl, nomadBin: h.s.Plan.NomadBin, consulBin: h.s.Plan.ConsulBin, installDir: filepath.Join(dir, "ns-install")}
	u, applied := op.installControlPlane(image)
	expiring := op.expiringTokens()
	t.Run("deploy user", func(t *testing.T) {
		deployUserSteps(t, p, cl, u, applied)
	})
	t.Run("under load behind Fabio", func(t *testing.T) {
		controlPlaneUnderLoad(t, p, op, cl, u, dc, image)
	})
	t.Run("errors a person can act on", func(t *testing.T) {
		actionableErrors(t, p, op, cl, u, expiring)
	})
}

// agentVersion runs `bin version` and reads it.
func agentVersion(bin, name string) (AgentVersion, error) {
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		return AgentVersion{}, fmt.Errorf("run %s version: %w: %s", bin, err, out)
	}
	return ParseAgentVersion(name, string(out))
}

// wireWorkloadIdentities does through Consul's API what `nomad setup
// consul -y` does: the JWT auth method nomad-workloads, a binding rule that
// makes a service's identity a service identity of that service, one that
// gives a task's identity the role nomad-<namespace>, and that role with a
// read-only policy. Nomad's keys are read once (prodidentity.go says why).
func wireWorkloadIdentities(ctx context.Context, cl *ProdCluster, cc *consul.Client) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cl.CA.CertPEM)
	cert, err := tls.LoadX509KeyPair(cl.User.Cert, cl.User.Key)
	if err != nil {
		return fmt.Errorf("wire workload identities: load the user certificate: %w", err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.NomadURL()+"/.well-known/jwks.json", nil)
	if err != nil {
		return fmt.Errorf("wire workload identities: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("wire workload identities: read Nomad's JWKS: %w", err)
	}
	doc, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("wire workload identities: read Nomad's JWKS: %s, %v: %s", resp.Status, err, doc)
	}
	keys, err := PublicKeysPEM(doc)
	if err != nil {
		return fmt.Errorf("wire workload identities: %w", err)
	}
	acl := cc.ACL()
	if _, _, err := acl.AuthMethodCreate(&consul.ACLAuthMethod{
		Name: WorkloadAuthMethod, Type: "jwt", DisplayName: WorkloadAuthMethod,
		Description: "login method for Nomad workload identities (as nomad setup consul)",
		Config:      WorkloadAuthMethodConfig(keys),
	}, nil); err != nil {
		return fmt.Errorf("wire workload identities: create the auth method %s: %w", WorkloadAuthMethod, err)
	}
	if _, _, err := acl.PolicyCreate(&consul.ACLPolicy{Name: "nomad-tasks", Description: "ACL policy used by Nomad tasks",
		Rules: "key_prefix \"\" { policy = \"read\" }\nservice_prefix \"\" { policy = \"read\" }\n"}, nil); err != nil {
		return fmt.Errorf("wire workload identities: create the policy nomad-tasks: %w", err)
	}
	if _, _, err := acl.RoleCreate(&consul.ACLRole{Name: "nomad-default", Description: "ACL role for tasks in the Nomad namespace default",
		Policies: []*consul.ACLRolePolicyLink{{Name: "nomad-tasks"}}}, nil); err != nil {
		return fmt.Errorf("wire workload identities: create the role nomad-default: %w", err)
	}
	for _, r := range []*consul.ACLBindingRule{
		{AuthMethod: WorkloadAuthMethod, Description: "binding rule for services registered from Nomad",
			Selector: `"nomad_service" in value`, BindType: consul.BindingRuleBindTypeService, BindName: "${value.nomad_service}"},
		{AuthMethod: WorkloadAuthMethod, Description: "binding rule for Nomad tasks",
			Selector: `"nomad_service" not in value`, BindType: consul.BindingRuleBindTypeRole, BindName: "nomad-${value.nomad_namespace}"},
	} {
		if _, _, err := acl.BindingRuleCreate(r, nil); err != nil {
			return fmt.Errorf("wire workload identities: create the binding rule %q: %w", r.Description, err)
		}
	}
	return nil
}
