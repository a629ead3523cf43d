package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

func newUUID(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Scenario 10: the ACL policies `install` renders are enough, and no more
// than what is needed is asked: on a second pair of agents with ACLs on
// (default deny), serve runs with a token holding only the control-plane
// policies and deploy/delete with one holding only the deploy policies, and
// a service deploys, answers, scales to zero, wakes and is deleted.
func TestE2E10MinimalACLPolicies(t *testing.T) {
	h := newHarness(t, "10 ACL policies")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("needs agents the suite starts itself: it bootstraps ACLs on a second pair")
	}
	dir := t.TempDir()
	acl := &devagents.ACL{ConsulManagementToken: newUUID(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	agents, err := devagents.Start(ctx, h.s.agentOptions(dir, acl))
	if err != nil {
		t.Fatalf("start agents with ACLs: %v", err)
	}
	t.Cleanup(func() {
		for _, k := range agents.Stop(agentStopGrace) {
			t.Error(k)
		}
	})
	h.timing("start ACL-enabled agents and bootstrap", time.Since(start))

	nm, err := nomad.NewClient(&nomad.Config{Address: agents.NomadAddr, SecretID: acl.NomadManagementToken})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := consul.NewClient(&consul.Config{Address: agents.ConsulAddr, Token: acl.ConsulManagementToken})
	if err != nil {
		t.Fatal(err)
	}

	// The policies exactly as install renders them.
	out := filepath.Join(dir, "install")
	h.mustCLI("install", "-out", out)
	policy := func(file string) string {
		b, err := os.ReadFile(filepath.Join(out, "policies", file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	nomadToken := func(name, file string) string {
		if _, err := nm.ACLPolicies().Upsert(&nomad.ACLPolicy{Name: name, Rules: policy(file)}, nil); err != nil {
			t.Fatalf("Nomad refuses policy %s from %s: %v", name, file, err)
		}
		tok, _, err := nm.ACLTokens().Create(&nomad.ACLToken{Name: name, Type: "client", Policies: []string{name}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok.SecretID
	}
	consulToken := func(name, file string) string {
		p, _, err := cm.ACL().PolicyCreate(&consul.ACLPolicy{Name: name, Rules: policy(file)}, nil)
		if err != nil {
			t.Fatalf("Consul refuses policy %s from %s: %v", name, file, err)
		}
		tok, _, err := cm.ACL().TokenCreate(&consul.ACLToken{Description: name, Policies: []*consul.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok.SecretID
	}
	cpEnv := map[string]string{
		"NOMAD_ADDR": agents.NomadAddr, "CONSUL_HTTP_ADDR": agents.ConsulAddr,
		"NOMAD_TOKEN":       nomadToken("nomad-serverless-control-plane", "nomad-control-plane.policy.hcl"),
		"CONSUL_HTTP_TOKEN": consulToken("nomad-serverless-control-plane", "consul-control-plane.policy.hcl"),
	}
	deployEnv := map[string]string{
		"NOMAD_ADDR": agents.NomadAddr, "CONSUL_HTTP_ADDR": agents.ConsulAddr,
		"NOMAD_TOKEN":       nomadToken("nomad-serverless-deploy", "nomad-deploy.policy.hcl"),
		"CONSUL_HTTP_TOKEN": consulToken("nomad-serverless-deploy", "consul-deploy.policy.hcl"),
	}

	// The policies are enforced (so what passes below passes because they
	// allow it): the control plane cannot register jobs, deploy users
	// cannot touch the leader lock's keys.
	cpNomad, _ := nomad.NewClient(&nomad.Config{Address: agents.NomadAddr, SecretID: cpEnv["NOMAD_TOKEN"]})
	if _, _, err := cpNomad.Jobs().Register(&nomad.Job{ID: new("acl-probe"), Name: new("acl-probe"), Type: new("batch"), Datacenters: []string{"*"},
		TaskGroups: []*nomad.TaskGroup{{Name: new("g"), Tasks: []*nomad.Task{{Name: "t", Driver: "raw_exec", Config: map[string]any{"command": "/bin/true"}}}}}}, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the control-plane token registered a job (err %v): the policy grants more than it says", err)
	}
	depConsul, _ := consul.NewClient(&consul.Config{Address: agents.ConsulAddr, Token: deployEnv["CONSUL_HTTP_TOKEN"]})
	if _, err := depConsul.KV().Put(&consul.KVPair{Key: "nomad-serverless/leader", Value: []byte("x")}, nil); err == nil {
		t.Errorf("the deploy token wrote outside nomad-serverless/services/")
	}

	// serve with the control-plane tokens, deploy and delete with the
	// deploy tokens.
	const svc = "e2e-acl"
	rev := revision(svc, 1)
	h.env, h.serveConsul = cpEnv, cm
	g := h.startServe("e2e-acl", "", "")
	// serve created the admin API's keyring; deploy users cannot read it
	// (whoever can, can sign admin API writes).
	if p, _, err := depConsul.KV().Get(consulroute.AdminKeysKey, nil); err == nil || p != nil {
		t.Errorf("the deploy token read the admin API keyring %s (err %v)", consulroute.AdminKeysKey, err)
	}
	h.env = deployEnv
	h.deploy(h.writeServices("acl.hcl", testService(svc)))
	client := NewClient(4)
	if o := g.request(svc, "", "/", client).Do(ctx); !o.OK() {
		t.Fatalf("request with the minimal tokens: %s\nserve:\n%s", o.Describe(), g.proc.Output())
	}
	// Scale to zero and wake: scale-job, read-job-scaling, the event stream
	// and Consul health all work with the control-plane token.
	eventually(t, 90*time.Second, rev+" at zero under ACLs", func() (bool, string) {
		n, err := groupCountOf(nm, rev)
		if err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("count %d", n)
	})
	if o := g.request(svc, "", "/", client).Do(ctx); !o.OK() {
		t.Fatalf("wake with the minimal tokens: %s\nserve:\n%s", o.Describe(), g.proc.Output())
	}
	// A 403 as a word: the log holds ports and IDs with 403 inside them
	// (admin=127.0.0.1:40313 failed a run).
	if permissionError.MatchString(g.proc.Output()) {
		t.Errorf("serve met a permission error with the control-plane policies:\n%s", g.proc.Output())
	}
	h.mustCLI("delete", svc)
	eventually(t, 60*time.Second, "delete with the deploy token purges "+rev, func() (bool, string) {
		jobs, _, err := nm.Jobs().PrefixList(svc + "-")
		return err == nil && len(jobs) == 0, fmt.Sprintf("%d jobs, %v", len(jobs), err)
	})
}

// permissionError is what Nomad's and Consul's API clients say when a
// token lacks a capability ("Unexpected response code: 403 (Permission
// denied)"), or a log line with the bare status.
var permissionError = regexp.MustCompile(`(?i)permission denied|\b403\b`)

func TestUnitPermissionError(t *testing.T) {
	for s, want := range map[string]bool{
		"msg=serving admin=127.0.0.1:40313":                 false,
		"id=20261202T174341Z-ecc7403b":                      false,
		"Unexpected response code: 403 (Permission denied)": true,
		"status=403":                   true,
		"rpc error: Permission denied": true,
	} {
		if got := permissionError.MatchString(s); got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
		}
	}
}
