package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The steps of deploy/README.md that scenario 26 takes on its production
// cluster, each with the CLI the README names (nomad, consul,
// nomad-serverless) and the environment it tells the reader to set.

// prodJob is the control plane's job ID (install's default).
const prodJob = "nomad-serverless"

// prodOperator runs the README's commands as the cluster's operator: the
// management tokens over mutual TLS.
type prodOperator struct {
	t         *testing.T
	h         *harness
	cl        *ProdCluster
	nomadBin  string
	consulBin string
	// installDir is where `install -out` writes the job and policies.
	installDir string
}

// run runs bin with args and env over this process's environment, logs
// the command and its output, and fails the test unless it exits 0.
func (o prodOperator) run(env map[string]string, bin string, args ...string) string {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = devagents.ChildEnv(os.Environ())
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	shown := make([]string, len(args))
	for i, a := range args {
		if k, _, ok := strings.Cut(a, "="); ok && strings.HasSuffix(k, "_token") {
			a = k + "=<redacted>"
		}
		shown[i] = a
	}
	o.t.Logf("$ %s %s\n%s", filepath.Base(bin), strings.Join(shown, " "), redactTokens(string(out)))
	if err != nil {
		o.t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(shown, " "), err, out)
	}
	return string(out)
}

// redactTokens keeps secrets out of the test log: a token's SecretID is
// a UUID after "SecretID" or "Secret ID".
func redactTokens(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.Contains(l, "SecretID") || strings.Contains(l, "Secret ID") {
			lines[i] = l[:strings.IndexAny(l, ":=")+1] + " <redacted>"
		}
	}
	return strings.Join(lines, "\n")
}

func (o prodOperator) env() map[string]string { return o.cl.Env(o.cl.NomadToken, o.cl.ConsulToken) }

func (o prodOperator) nomadCLI(args ...string) string {
	o.t.Helper()
	return o.run(o.env(), o.nomadBin, args...)
}

func (o prodOperator) consulCLI(args ...string) string {
	o.t.Helper()
	return o.run(o.env(), o.consulBin, args...)
}

func (o prodOperator) ns(args ...string) string {
	o.t.Helper()
	return o.run(o.env(), o.h.bin, args...)
}

// secretID reads SecretID from a token printed as JSON (nomad acl token
// create -json, consul acl token create -format json).
func secretID(t *testing.T, out string) string {
	t.Helper()
	var tok struct{ SecretID string }
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &tok); err != nil || tok.SecretID == "" {
		t.Fatalf("read a token's SecretID: %v", err)
	}
	return tok.SecretID
}

// prodInstallArgs are the install flags of the scenario: three replicas,
// the scratch image, each gateway on its node's address (three nodes share
// one machine), Consul's HTTPS on the node's agent with the control plane's
// client certificate, and a tag for Fabio.
func prodInstallArgs(image string, extra ...string) []string {
	args := []string{"install",
		"-domain", "localhost", "-replicas", "3", "-image", image, "-https-port", "0",
		"-gateway-ip", "${NOMAD_IP_gateway}",
		"-consul-addr", fmt.Sprintf("https://${attr.unique.network.ip-address}:%d", ConsulHTTPSPort),
		"-consul-tls", "variable",
		"-gateway-tags", "urlprefix-/",
	}
	return append(args, extra...)
}

// deployUser is what the operator hands a deploy user: tokens holding only
// the deploy policies.
type deployUser struct{ nomadToken, consulToken string }

// installControlPlane takes the README's "Install, step by step": render,
// the policies and tokens, the Variable, install -apply, then the checks of
// step 5. It returns the deploy user's tokens and when -apply returned.
func (o prodOperator) installControlPlane(image string) (deployUser, time.Time) {
	o.t.Helper()
	// 1. Render the files.
	o.ns(append(prodInstallArgs(image), "-out", o.installDir)...)
	policy := func(name string) string { return filepath.Join(o.installDir, "policies", name) }

	// 2. Nomad policies: the control plane's attached to the job's
	// workload identity, the deploy policy for a deploy token.
	o.nomadCLI("acl", "policy", "apply", "-namespace", "default", "-job", prodJob,
		"nomad-serverless-control-plane", policy("nomad-control-plane.policy.hcl"))
	o.nomadCLI("acl", "policy", "apply", "nomad-serverless-deploy", policy("nomad-deploy.policy.hcl"))
	var u deployUser
	u.nomadToken = secretID(o.t, o.nomadCLI("acl", "token", "create", "-name", "deployer", "-policy", "nomad-serverless-deploy", "-json"))

	// 3. Consul policies, the control plane's token and client
	// certificate in the job's Variable, the deploy token.
	o.consulCLI("acl", "policy", "create", "-name", "nomad-serverless-control-plane", "-rules", "@"+policy("consul-control-plane.policy.hcl"))
	o.consulCLI("acl", "policy", "create", "-name", "nomad-serverless-deploy", "-rules", "@"+policy("consul-deploy.policy.hcl"))
	cpToken := secretID(o.t, o.consulCLI("acl", "token", "create", "-description", "nomad-serverless serve", "-policy-name", "nomad-serverless-control-plane", "-format", "json"))
	cpTLS, err := o.cl.IssueClient("nomad-serverless")
	if err != nil {
		o.t.Fatal(err)
	}
	o.nomadCLI("var", "put", "nomad/jobs/"+prodJob, "consul_token="+cpToken,
		"consul_ca=@"+cpTLS.CA, "consul_client_cert=@"+cpTLS.Cert, "consul_client_key=@"+cpTLS.Key)
	u.consulToken = secretID(o.t, o.consulCLI("acl", "token", "create", "-description", "deployer", "-policy-name", "nomad-serverless-deploy", "-format", "json"))

	// 4. Run it.
	o.ns(append(prodInstallArgs(image), "-apply")...)
	applied := time.Now()

	// 5. Check: every replica running, one per node; both services in
	// Consul with 3 passing instances; /healthz ok on every node.
	nc, err := o.cl.NomadClient("")
	if err != nil {
		o.t.Fatal(err)
	}
	cc, err := o.cl.ConsulClient("")
	if err != nil {
		o.t.Fatal(err)
	}
	eventually(o.t, 4*time.Minute, "3 replicas of "+prodJob+" running, one per node", func() (bool, string) {
		allocs, _, err := nc.Jobs().Allocations(prodJob, false, nil)
		if err != nil {
			return false, err.Error()
		}
		nodes := map[string]bool{}
		var states []string
		for _, a := range allocs {
			states = append(states, fmt.Sprintf("%.8s on %.8s: %s/%s %s", a.ID, a.NodeID, a.DesiredStatus, a.ClientStatus, taskEventsLine(a)))
			if a.ClientStatus == nomad.AllocClientStatusRunning && a.DesiredStatus == nomad.AllocDesiredStatusRun {
				nodes[a.NodeID] = true
			}
		}
		return len(nodes) == 3, strings.Join(states, "; ")
	})
	for _, svc := range []string{"nomad-serverless-gateway", "nomad-serverless-activator"} {
		eventually(o.t, 2*time.Minute, "3 passing instances of "+svc+" in Consul", func() (bool, string) {
			es, _, err := cc.Health().Service(svc, "", true, nil)
			if err != nil {
				return false, err.Error()
			}
			return len(es) == 3, fmt.Sprintf("%d passing; the catalog: %s", len(es), prodConsulServices(cc))
		})
	}
	for i := 1; i <= 3; i++ {
		url := fmt.Sprintf("http://%s:8081/healthz", ProdNodeAddr(i))
		status, body, err := getBody(&http.Client{Timeout: 5 * time.Second}, url)
		if err != nil || status != 200 || strings.TrimSpace(body) != "ok" {
			o.t.Errorf("GET %s: %d %q %v, want 200 ok", url, status, body, err)
		}
	}
	return u, applied
}

// taskEventsLine is an allocation's last task event per task, for a
// message while waiting.
func taskEventsLine(a *nomad.AllocationListStub) string {
	var parts []string
	for name, st := range a.TaskStates {
		if n := len(st.Events); n > 0 {
			e := st.Events[n-1]
			parts = append(parts, fmt.Sprintf("%s: %s %s", name, e.Type, cmp.Or(e.DisplayMessage, e.Message)))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// deployUserSteps are the deploy user's: deploy, a wake from zero through
// an installed replica's gateway, a split between two revisions, status
// and logs, and delete, after which nothing of the service is left in
// Consul or Nomad. It returns the first request's answer time.
func deployUserSteps(t *testing.T, h *harness, cl *ProdCluster, u deployUser, applied time.Time) {
	t.Helper()
	p := h.on(t)
	p.env = cl.Env(u.nomadToken, u.consulToken)
	const svc = "e2e-prod"
	gw := &gateway{listen: ProdNodeAddr(1) + ":8080", admin: ProdNodeAddr(1) + ":8081"}

	rev1 := revision(svc, 1)
	p.deploy(p.writeServices("prod-v1.hcl", Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "prod-v1"}, Concurrency: 10, Scaling: FastScaling()}))
	first := gw.request(svc, "", "/", NewClient(1)).Do(context.Background())
	if !first.OK() || first.App != "prod-v1" {
		t.Fatalf("first request through %s: %s (app %q)", gw.listen, first.Describe(), first.App)
	}
	p.timing("install -apply to the first request served (3 replicas, a deploy in between)", first.FirstByte.Sub(applied))

	// A wake from zero through another node's gateway.
	p.waitZero(rev1, 2*time.Minute)
	gw2 := &gateway{listen: ProdNodeAddr(2) + ":8080", admin: ProdNodeAddr(2) + ":8081"}
	o := gw2.request(svc, "", "/", NewClient(1)).Do(context.Background())
	if !o.OK() || o.App != "prod-v1" {
		t.Fatalf("request at zero through %s: %s (app %q)", gw2.listen, o.Describe(), o.App)
	}
	p.timing("wake from zero through an installed replica", o.FirstByte.Sub(o.Start))

	// Two revisions, half the traffic each.
	rev2 := revision(svc, 2)
	p.deploy(p.writeServices("prod-v2.hcl", Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "prod-v2"}, Concurrency: 10,
		Scaling: Scaling{Min: 1, Max: 5, Initial: 1, Target: 5, Window: 6 * time.Second, ScaleToZeroGrace: 2 * time.Second}}))
	p.mustCLI("traffic", "-to", rev1+"=50", "-to", rev2+"=50", svc)
	seen := map[string]int{}
	eventually(t, 2*time.Minute, "both revisions answer through "+gw.listen, func() (bool, string) {
		o := gw.request(svc, "", "/", NewClient(1)).Do(context.Background())
		if o.OK() {
			seen[o.App]++
		}
		return seen["prod-v1"] > 0 && seen["prod-v2"] > 0, fmt.Sprintf("answers %v, last %s", seen, o.Describe())
	})

	// status and logs, with the deploy user's tokens.
	if out := p.mustCLI("status", svc); !strings.Contains(out, rev1) || !strings.Contains(out, rev2) || !strings.Contains(out, "50%") {
		t.Errorf("status lacks the two revisions at 50%%:\n%s", out)
	}
	eventually(t, time.Minute, "logs shows the app's and the sidecar's output", func() (bool, string) {
		app, errOut, code := p.cli("logs", "-follow=false", "-since", "10m", "-stderr", "-revision", rev2, svc)
		if code != 0 || !strings.Contains(app, "testapp: listening") {
			return false, fmt.Sprintf("app's stderr: exit %d: %q %s", code, app, errOut)
		}
		sidecar, errOut, code := p.cli("logs", "-follow=false", "-since", "10m", "-sidecar", "-stderr", "-revision", rev2, svc)
		return code == 0 && strings.Contains(sidecar, `"msg":`), fmt.Sprintf("sidecar's stderr: exit %d: %q %s", code, sidecar, errOut)
	})

	// delete: nothing left.
	// As in scenario 8: Nomad deregisters an allocation's services when
	// its client has stopped it, a moment after the purge returns.
	deleted := time.Now()
	p.mustCLI("delete", svc)
	eventually(t, 90*time.Second, "nothing of "+svc+" left in Nomad or Consul", func() (bool, string) {
		found, _ := p.leftovers(svc, []string{rev1, rev2})
		return len(found) == 0, strings.Join(found, "; ")
	})
	p.timing("delete -> nothing left in Nomad and Consul (deploy user)", time.Since(deleted))
}

// prodConsulServices are the names in Consul's catalog, for a message.
func prodConsulServices(cc *consul.Client) string {
	svcs, _, err := cc.Catalog().Services(nil)
	if err != nil {
		return err.Error()
	}
	var names []string
	for n := range svcs {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// controlPlaneUnderLoad puts Fabio (from the catalog's
// nomad-serverless-gateway) in front of the three gateways, runs 8
// connections of load through it, and then: a rolling update of the control
// plane by install -apply with a changed setting (no request may fail), and
// a kill -9 of one replica's serve (Nomad restarts it; a wake through Fabio
// answers; only requests in flight at the kill may fail; the replica's
// registrations do not outlive it, and a service deleted right after the
// kill leaves nothing in Consul).
func controlPlaneUnderLoad(t *testing.T, h *harness, op prodOperator, cl *ProdCluster, u deployUser, dc *DockerClient, image string) {
	fabioBin, err := exec.LookPath("fabio")
	if err != nil {
		t.Skip("e2e 26: fabio is not on PATH (install from https://github.com/fabiolb/fabio/releases): the catalog-driven proxy in front is Fabio")
	}
	p := h.on(t)
	p.env = cl.Env(u.nomadToken, u.consulToken)
	ctx := context.Background()
	const svc, sleeper = "e2e-prod-load", "e2e-prod-zero"
	p.deploy(p.writeServices("load.hcl", Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "load"}, Concurrency: 10,
		Scaling: Scaling{Min: 1, Max: 5, Initial: 1, Target: 5, Window: 6 * time.Second, ScaleToZeroGrace: 2 * time.Second}}))
	p.deploy(p.writeServices("zero.hcl", Service{Name: sleeper, Env: map[string]string{"TESTAPP_NAME": "zero"}, Concurrency: 10, Scaling: FastScaling()}))

	// Fabio reads the catalog with a token of its own (read on services,
	// nodes and agents: it asks /v1/agent/self at start) and the CA and a client certificate (mutual TLS).
	rules := filepath.Join(op.installDir, "fabio.policy.hcl")
	if err := os.WriteFile(rules, []byte("service_prefix \"\" {\n  policy = \"read\"\n}\nnode_prefix \"\" {\n  policy = \"read\"\n}\nagent_prefix \"\" {\n  policy = \"read\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	op.consulCLI("acl", "policy", "create", "-name", "fabio", "-rules", "@"+rules)
	fabioToken := secretID(t, op.consulCLI("acl", "token", "create", "-description", "fabio", "-policy-name", "fabio", "-format", "json"))
	fabioTLS, err := cl.IssueClient("fabio")
	if err != nil {
		t.Fatal(err)
	}
	f := p.runFabio(fabioBin, FabioConfig{
		Proxy: fmt.Sprintf("%s:%d", ProdServerAddr(), testbin.FreePort(t)), UI: fmt.Sprintf("%s:%d", ProdServerAddr(), testbin.FreePort(t)),
		Consul: "https://" + cl.ConsulAddr(), Token: fabioToken, TLS: fabioTLS,
	})
	eventually(t, time.Minute, "Fabio routes / to the 3 gateways", func() (bool, string) {
		rs, err := f.routes()
		if err != nil {
			return false, err.Error()
		}
		var dsts []string
		for _, r := range rs {
			if r.Service == "nomad-serverless-gateway" && r.Path == "/" {
				dsts = append(dsts, r.Dst)
			}
		}
		return len(dsts) == 3, fmt.Sprintf("gateway routes %v (of %d)", dsts, len(rs))
	})
	req := Request{Client: NewClient(8), URL: "http://" + f.proxy + "/", Host: host(svc, ""), Timeout: 30 * time.Second}
	if o := req.Do(ctx); !o.OK() || o.App != "load" {
		t.Fatalf("a request through Fabio: %s (app %q)", o.Describe(), o.App)
	}
	load := StartLoad(ctx, req, 8, 10*time.Millisecond, 15*time.Minute)
	defer load.Stop()
	time.Sleep(3 * time.Second)

	// A rolling update: the same install with more memory per replica.
	nc := p.nomad
	before, _, err := nc.Jobs().Info(prodJob, nil)
	if err != nil {
		t.Fatal(err)
	}
	rollStart := time.Now()
	op.ns(append(prodInstallArgs(image, "-memory", "320"), "-apply")...)
	eventually(t, 6*time.Minute, "the rolling update of "+prodJob+" succeeds", func() (bool, string) {
		d, _, err := nc.Jobs().LatestDeployment(prodJob, nil)
		if err != nil || d == nil {
			return false, fmt.Sprint(err)
		}
		return d.JobVersion > *before.Version && d.Status == nomad.DeploymentStatusSuccessful, fmt.Sprintf("deployment of version %d: %s %s", d.JobVersion, d.Status, d.StatusDescription)
	})
	time.Sleep(3 * time.Second)
	roll := since(load.Snapshot(), rollStart)
	p.timing("rolling update of the control plane (3 replicas, one at a time, 10 s healthy each)", time.Since(rollStart))
	t.Logf("rolling update under 8 connections through Fabio: %s", roll.Summary())
	if failed := roll.Failed(); len(failed) > 0 {
		t.Errorf("the rolling update failed %d of %d requests: %s", len(failed), len(roll), roll.Summary())
	}

	// kill -9 of node 2's serve.
	alloc := runningAllocOn(t, nc, 2)
	// The allocation runs two containers, serve and its socket keeper;
	// Nomad names each <task>-<allocation ID>.
	all, err := dc.Containers(ctx, false, nomadAllocLabel+"="+alloc.ID)
	var cs []ContainerSummary
	for _, c := range all {
		if c.Name() == "serve-"+alloc.ID {
			cs = append(cs, c)
		}
	}
	if err != nil || len(cs) != 1 {
		t.Fatalf("the serve container of allocation %s: %v %v", alloc.ID, all, err)
	}
	info, err := dc.Container(ctx, cs[0].ID)
	if err != nil || info.State.Pid == 0 {
		t.Fatalf("inspect %s: %v (pid %d)", cs[0].ID, err, info.State.Pid)
	}
	standInsBefore := registrationsOf(t, p.consul, alloc.ID, false)
	// When Consul stops listing the replica's gateway as passing: the
	// moment Fabio can learn it is gone.
	withdrawnC := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			es, _, err := p.consul.Health().Service("nomad-serverless-gateway", "", true, nil)
			if err == nil && len(es) < 3 {
				withdrawnC <- time.Now()
				return
			}
		}
		close(withdrawnC)
	}()
	killAt := time.Now()
	if err := syscall.Kill(info.State.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 serve (pid %d): %v", info.State.Pid, err)
	}
	withdrawn, ok := <-withdrawnC
	if !ok {
		t.Fatalf("Consul still lists 3 passing gateways a minute after the kill -9")
	}
	t.Logf("the killed replica's gateway left Consul's passing instances %s after the kill", withdrawn.Sub(killAt).Round(time.Millisecond))
	t.Logf("kill -9 of serve in allocation %.8s on node 2 (pid %d); its registrations before: %v", alloc.ID, info.State.Pid, standInsBefore)
	// A service deleted right after the kill: delete waits until Consul
	// lists nothing of it (the killed replica's stand-in goes when Nomad
	// has restarted the replica, about a second after the kill, and it
	// sweeps), and 3 s after delete returns nothing of it is in Consul,
	// critical or not.
	p.mustCLI("delete", sleeper)
	deleted := time.Now()
	t.Logf("delete right after the kill returned %s after the kill", deleted.Sub(killAt).Round(time.Millisecond))
	time.Sleep(time.Until(deleted.Add(3 * time.Second)))
	if regs := registrationsOf(t, p.consul, revision(sleeper, 1), false); len(regs) > 0 {
		t.Errorf("3 s after a delete right after the kill, still in Consul: %v", regs)
	}
	// Within 10 s of the kill, nothing the killed replica registered is
	// left behind: each registration is gone, or passing again because
	// Nomad restarted the replica (it adopts its own stand-ins).
	restartedServe := func() (bool, string) {
		a, _, err := nc.Allocations().Info(alloc.ID, nil)
		if err != nil {
			return false, err.Error()
		}
		st := a.TaskStates["serve"]
		return st != nil && st.Restarts >= 1 && st.State == "running", fmt.Sprintf("task serve: %+v", st)
	}
	eventually(t, time.Until(killAt.Add(10*time.Second)), "nothing of the killed replica is left behind in Consul", func() (bool, string) {
		all, passing := registrationsOf(t, p.consul, alloc.ID, false), registrationsOf(t, p.consul, alloc.ID, true)
		if len(all) == 0 {
			return true, ""
		}
		back, why := restartedServe()
		return back && len(passing) == len(all), fmt.Sprintf("registered %v, passing %v; %s", all, passing, why)
	})
	t.Logf("%s after the kill, the killed replica's registrations (all passing again or gone): %v", time.Since(killAt).Round(time.Millisecond), registrationsOf(t, p.consul, alloc.ID, false))
	eventually(t, 2*time.Minute, "Nomad restarts the killed serve and its gateway passes again", func() (bool, string) {
		if back, why := restartedServe(); !back {
			return false, why
		}
		es, _, err := p.consul.Health().Service("nomad-serverless-gateway", "", true, nil)
		return err == nil && len(es) == 3, fmt.Sprintf("%d passing gateways, %v", len(es), err)
	})
	restarted := time.Since(killAt)
	// A wake through Fabio answers.
	p.deploy(p.writeServices("zero2.hcl", Service{Name: sleeper + "2", Env: map[string]string{"TESTAPP_NAME": "zero2"}, Concurrency: 10, Scaling: FastScaling()}))
	p.waitZero(revision(sleeper+"2", 1), 2*time.Minute)
	wake := Request{Client: NewClient(1), URL: "http://" + f.proxy + "/", Host: host(sleeper+"2", ""), Timeout: 60 * time.Second}.Do(ctx)
	if !wake.OK() || wake.App != "zero2" {
		t.Errorf("a wake through Fabio after the kill: %s (app %q)", wake.Describe(), wake.App)
	}
	p.mustCLI("delete", sleeper+"2")
	killed := since(load.Stop(), killAt.Add(-30*time.Second))
	// Only a request in flight to the replica at the kill may fail: the
	// ports outlive serve in its socket keeper, so a connection Fabio
	// makes before it learns the replica left waits for the serve Nomad
	// restarts instead of being refused.
	var inFlight, sentAfter Result
	for _, o := range killed.Failed() {
		if !o.Start.After(killAt) {
			inFlight = append(inFlight, o)
		} else {
			sentAfter = append(sentAfter, o)
		}
	}
	t.Logf("kill -9 under 8 connections through Fabio: %s; failed: %d in flight at the kill, %d sent after it; serve back in %s",
		killed.Summary(), len(inFlight), len(sentAfter), restarted.Round(time.Millisecond))
	if len(sentAfter) > 0 {
		t.Errorf("%d requests sent after the kill failed (only those in flight may): %s", len(sentAfter), sentAfter.Summary())
		for i, o := range sentAfter {
			if i == 5 {
				break
			}
			t.Logf("  sent %s after the kill: %s", o.Start.Sub(killAt).Round(time.Millisecond), o.Describe())
		}
	}
	p.mustCLI("delete", svc)
}

// since is the outcomes of r that started at or after t.
func since(r Result, t time.Time) Result {
	var out Result
	for _, o := range r {
		if !o.Start.Before(t) {
			out = append(out, o)
		}
	}
	return out
}

// runningAllocOn is the control plane's running allocation on node i.
func runningAllocOn(t *testing.T, nc *nomad.Client, i int) *nomad.AllocationListStub {
	t.Helper()
	nodes, _, err := nc.Nodes().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	var nodeID string
	for _, n := range nodes {
		if n.Name == fmt.Sprintf("node-%d", i) {
			nodeID = n.ID
		}
	}
	allocs, _, err := nc.Jobs().Allocations(prodJob, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range allocs {
		if a.NodeID == nodeID && a.ClientStatus == nomad.AllocClientStatusRunning && a.DesiredStatus == nomad.AllocDesiredStatusRun {
			return a
		}
	}
	t.Fatalf("no running allocation of %s on node-%d", prodJob, i)
	return nil
}

// registrationsOf lists the Consul service instances whose ID contains
// part (a replica's ID: serve registers its activator and stand-ins with
// it, Nomad the gateway service with the allocation's; or a revision's
// name), only the passing ones when passingOnly.
func registrationsOf(t *testing.T, cc *consul.Client, part string, passingOnly bool) []string {
	t.Helper()
	svcs, _, err := cc.Catalog().Services(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for name := range svcs {
		es, _, err := cc.Health().Service(name, "", passingOnly, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if strings.Contains(e.Service.ID, part) {
				out = append(out, e.Service.ID)
			}
		}
	}
	slices.Sort(out)
	return out
}
