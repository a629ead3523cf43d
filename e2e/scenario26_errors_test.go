package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// expiringUser is a deploy user whose tokens (the deploy policies, as the
// README makes them) expire a minute after they were made: Nomad's and
// Consul's shortest TTL by default. Scenario 26 makes them before the deploy
// user's steps and uses them in actionableErrors, well after.
type expiringUser struct {
	deployUser
	expires time.Time
}

func (o prodOperator) expiringTokens() expiringUser {
	o.t.Helper()
	var u expiringUser
	u.expires = time.Now().Add(time.Minute)
	u.nomadToken = secretID(o.t, o.nomadCLI("acl", "token", "create", "-name", "deployer-1m", "-policy", "nomad-serverless-deploy", "-ttl", "1m", "-json"))
	u.consulToken = secretID(o.t, o.consulCLI("acl", "token", "create", "-description", "deployer-1m", "-policy-name", "nomad-serverless-deploy", "-expires-ttl", "1m", "-format", "json"))
	return u
}

// actionableErrors is part 3 of issue 33: a wrong CA, a missing or an
// expired token, a policy that lacks a capability, and a workload identity
// that Consul does not accept each end the command with one message that
// names what to set or grant, on the real agents, without a retry loop
// hiding it (the command exits well before any of its waits would).
func actionableErrors(t *testing.T, h *harness, op prodOperator, cl *ProdCluster, u deployUser, expired expiringUser) {
	p := h.on(t)
	p.env = cl.Env(u.nomadToken, u.consulToken)
	const svc = "e2e-prod-errors"
	p.deploy(p.writeServices("errors.hcl", Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "errors"}, Concurrency: 10, Scaling: FastScaling()}))
	next := p.writeServices("errors-v2.hcl", Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "errors-v2"}, Concurrency: 10, Scaling: FastScaling()})

	// A CA that signed neither agent's certificate.
	other, err := NewCA("not the cluster's CA")
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(cl.Dir, "other-ca.pem")
	if err := os.WriteFile(otherCA, other.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	// Tokens whose policies lack what deploy needs: Nomad's may read jobs
	// but not submit them, Consul's may read but not write.
	op.nomadCLI("acl", "policy", "apply", "read-jobs", writeFile(t, cl.Dir, "read-jobs.policy.hcl",
		"namespace \"default\" {\n  capabilities = [\"list-jobs\", \"read-job\"]\n}\n"))
	readNomad := secretID(t, op.nomadCLI("acl", "token", "create", "-name", "reader", "-policy", "read-jobs", "-json"))
	op.consulCLI("acl", "policy", "create", "-name", "read-only", "-rules", "@"+writeFile(t, cl.Dir, "read-only.policy.hcl",
		"service_prefix \"\" {\n  policy = \"read\"\n}\nnode_prefix \"\" {\n  policy = \"read\"\n}\nkey_prefix \"nomad-serverless/services/\" {\n  policy = \"read\"\n}\n"))
	readConsul := secretID(t, op.consulCLI("acl", "token", "create", "-description", "reader", "-policy-name", "read-only", "-format", "json"))
	time.Sleep(time.Until(expired.expires.Add(5 * time.Second)))

	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"Nomad's certificate from another CA", map[string]string{"NOMAD_CACERT": otherCA}, []string{"status", svc},
			[]string{"NOMAD_CACERT", otherCA, "not signed by"}},
		{"Consul's certificate from another CA", map[string]string{"CONSUL_CACERT": otherCA}, []string{"status", svc},
			[]string{"cannot talk to Consul at", "over TLS", "CONSUL_CACERT", otherCA, "not signed by"}},
		{"no Nomad client certificate", map[string]string{"NOMAD_CLIENT_CERT": "", "NOMAD_CLIENT_KEY": ""}, []string{"status", svc},
			[]string{"NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"}},
		{"no Nomad token", map[string]string{"NOMAD_TOKEN": ""}, []string{"status", svc},
			[]string{"NOMAD_TOKEN is not set", "nomad-serverless-deploy"}},
		{"no Consul token", map[string]string{"CONSUL_HTTP_TOKEN": ""}, []string{"status", svc},
			[]string{"CONSUL_HTTP_TOKEN is not set", "nomad-serverless-deploy"}},
		{"an expired Nomad token", map[string]string{"NOMAD_TOKEN": expired.nomadToken}, []string{"status", svc},
			[]string{"NOMAD_TOKEN", "expired"}},
		{"an expired Consul token", map[string]string{"CONSUL_HTTP_TOKEN": expired.consulToken}, []string{"status", svc},
			[]string{"CONSUL_HTTP_TOKEN", "expired"}},
		{"a Nomad policy without submit-job", map[string]string{"NOMAD_TOKEN": readNomad}, []string{"deploy", "-sidecar-command", h.bin, "-wait", "3m", next},
			[]string{"NOMAD_TOKEN", `"submit-job" on namespace "default"`, "nomad-serverless-deploy"}},
		{"a Consul policy without service write", map[string]string{"CONSUL_HTTP_TOKEN": readConsul}, []string{"deploy", "-sidecar-command", h.bin, "-wait", "3m", next},
			[]string{"the token in CONSUL_HTTP_TOKEN lacks", "nomad-serverless-deploy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := h.on(t)
			q.env = cl.Env(u.nomadToken, u.consulToken)
			for k, v := range c.env {
				q.env[k] = v
			}
			expectActionable(t, q, c.args, c.want)
		})
	}
	p.mustCLI("status", svc) // none of that broke anything

	// A workload identity Consul does not accept: without the binding
	// rule for services, Consul's login gives Nomad no token for the
	// revision's service, and the allocation fails before its tasks run.
	t.Run("a workload identity Consul does not accept", func(t *testing.T) {
		cc, err := cl.ConsulClient("")
		if err != nil {
			t.Fatal(err)
		}
		rules, _, err := cc.ACL().BindingRuleList(WorkloadAuthMethod, nil)
		if err != nil {
			t.Fatal(err)
		}
		var removed *consul.ACLBindingRule
		for _, r := range rules {
			if r.BindType == consul.BindingRuleBindTypeService {
				removed = r
				if _, err := cc.ACL().BindingRuleDelete(r.ID, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		if removed == nil {
			t.Fatalf("no service binding rule on %s: %+v", WorkloadAuthMethod, rules)
		}
		defer func() {
			removed.ID = ""
			if _, _, err := cc.ACL().BindingRuleCreate(removed, nil); err != nil {
				t.Errorf("put the binding rule back: %v", err)
			}
		}()
		q := h.on(t)
		q.env = cl.Env(u.nomadToken, u.consulToken)
		wi := q.writeServices("errors-wi.hcl", Service{Name: svc + "-wi", Env: map[string]string{"TESTAPP_NAME": "wi"}, Concurrency: 10, Scaling: FastScaling()})
		expectActionable(t, q, []string{"deploy", "-sidecar-command", h.bin, "-wait", "3m", wi},
			[]string{"workload identity", WorkloadAuthMethod, "binding rule"})
		q.mustCLI("delete", svc+"-wi")
	})
	p.mustCLI("delete", svc)
}

// expectActionable runs the CLI, which must fail, well before its own
// waits (3 minutes) would end, with every one of want in what it printed.
func expectActionable(t *testing.T, h *harness, args, want []string) {
	t.Helper()
	start := time.Now()
	out, errOut, code := h.cli(args...)
	took := time.Since(start)
	all := out + errOut
	if code == 0 {
		t.Fatalf("nomad-serverless %s succeeded:\n%s", strings.Join(args, " "), all)
	}
	if took > 90*time.Second {
		t.Errorf("nomad-serverless %s took %s to fail: a retry loop hid the error", strings.Join(args, " "), took.Round(time.Second))
	}
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("nomad-serverless %s: the message lacks %q:\n%s", strings.Join(args, " "), w, all)
		}
	}
	t.Logf("failed in %s with exit %d", took.Round(time.Millisecond), code)
}

// writeFile writes content to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(fmt.Errorf("write %s: %w", path, err))
	}
	return path
}
