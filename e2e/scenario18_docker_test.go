package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// distrolessUsers are the users of gcr.io/distroless images by name, as
// the scratch image (no /etc/passwd) must give them by number.
var distrolessUsers = map[string]string{"nonroot:nonroot": "65532:65532", "nonroot": "65532", "root": "0"}

// nomadAllocLabel is the label Nomad's docker driver puts on every
// container of an allocation (the pause container too).
const nomadAllocLabel = "com.hashicorp.nomad.alloc_id"

// Scenario 18: docker, the driver most Nomad users run, on a real dockerd
// (the machine's, or one the scenario starts with its state in a temporary
// directory). One image FROM scratch holding the binary under test
// (deploy/Dockerfile.scratch) is both the user task (`testapp`) and the
// sidecar (deploy -sidecar-image), on a pair of dev agents whose Nomad has
// the docker driver configured for local images (devagents.Docker):
//   - the image behaves like the repository's Dockerfile: entrypoint,
//     `serve` by default, non-root;
//   - a container listening on fixed port 80 in host networking: deploy,
//     ready, request through the gateway, its port published on 127.0.0.1
//     at the host port Nomad picked, which is where the sidecar (a
//     container in the host's network) reaches it;
//   - resources reach the containers (docker's memory limit and CPU
//     shares);
//   - scale to zero and 10 wakes, each wake's timeline checked and
//     tabled (target: a median of at most 0.8 s to the first byte);
//   - network { mode = "bridge" } with the CNI plugins the machine has:
//     only the sidecar's ports exposed, the app's fixed port internal to
//     the allocation's namespace;
//   - delete leaves no container running.
func TestE2E18Docker(t *testing.T) {
	h := newHarness(t, "18 docker")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("docker: SKIPPED: needs agents the suite starts itself (a Nomad agent whose docker driver keeps local images)")
	}
	plan := DecideDocker(os.Getenv, exec.LookPath, PingHost)
	if plan.Skip != "" {
		t.Skip(plan.Skip)
	}
	ctx := context.Background()
	// Short: dockerd's and containerd's unix sockets live below it.
	dir := h.scratchDir("ns-e2e-docker-", "docker scenario's files (dockerd and agent logs)")
	host, ownDockerd := h.dockerd(ctx, plan, dir)
	dc := NewDockerClient(host)

	// The images: the binary under test FROM scratch, and the pause
	// image of bridge allocations.
	image, pauseImage := "nomad-serverless:e2e", "nomad-serverless-pause:e2e"
	if !ownDockerd {
		// Someone else's dockerd: our own tags, removed at the end.
		image, pauseImage = fmt.Sprintf("nomad-serverless:e2e-%d", os.Getpid()), fmt.Sprintf("nomad-serverless-pause:e2e-%d", os.Getpid())
		t.Cleanup(func() {
			for _, ref := range []string{image, pauseImage} {
				if err := dc.RemoveImage(context.Background(), ref); err != nil {
					t.Logf("remove image %s: %v", ref, err)
				}
			}
		})
	}
	start := time.Now()
	h.buildImages(dc, dir, image, pauseImage)
	h.timing("build both images FROM scratch (binary, pause)", time.Since(start))
	h.checkImageLikeDockerfile(dc, image)

	// Agents whose Nomad runs docker tasks from local images.
	cniPath, noCNI := FindCNIPath(CNIPathCandidates)
	agentDir := filepath.Join(dir, "agents")
	if err := os.Mkdir(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// A host volume for the real app below, readable by the image's
	// non-root user.
	volDir := filepath.Join(dir, "volume")
	if err := os.Mkdir(volDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volDir, "hello.txt"), []byte("hello from the host volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agentOpts := h.s.agentOptions(agentDir, nil)
	agentOpts.Config.HostVolumes = map[string]string{"e2e-data": volDir}
	start = time.Now()
	agents, err := devagents.StartDocker(actx, agentOpts, devagents.Docker{Endpoint: host, CNIPath: cniPath, InfraImage: pauseImage, KeepImages: true})
	if err != nil {
		t.Fatalf("start agents with the docker driver: %v", err)
	}
	t.Cleanup(func() {
		for _, k := range agents.Stop(agentStopGrace) {
			t.Error(k)
		}
	})
	h.timing("start Consul and Nomad dev agents (docker driver healthy)", time.Since(start))
	if h.nomad, err = nomad.NewClient(&nomad.Config{Address: agents.NomadAddr}); err != nil {
		t.Fatal(err)
	}
	if h.consul, err = consul.NewClient(&consul.Config{Address: agents.ConsulAddr}); err != nil {
		t.Fatal(err)
	}
	h.env = map[string]string{"NOMAD_ADDR": agents.NomadAddr, "CONSUL_HTTP_ADDR": agents.ConsulAddr}
	g := h.startServe("e2e-18", "", "")
	client := NewClient(8)
	var allocs []string // every allocation of the scenario, for the end

	// Host networking, the app on fixed port 80.
	const svc = "e2e-docker"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	s := DockerService{
		Name: svc, Image: image, Args: []string{"testapp"}, Port: 80,
		// The app must listen on the container's interface, not its
		// loopback, for the published port to reach it.
		Env: map[string]string{"TESTAPP_NAME": "docker", "TESTAPP_HOST": "0.0.0.0"},
		CPU: 50, MemoryMB: 96, Concurrency: 10, Scaling: FastScaling(),
	}
	s.Scaling.Min = 1 // steady while it is inspected; 0 below
	start = time.Now()
	out := h.deployImage(h.writeDockerServices("docker.hcl", s), image)
	h.timing("deploy -> ready", time.Since(start))
	if r := out.Ready[rev]; r.Passing != 1 {
		t.Fatalf("deploy did not report %s ready with 1 instance: %+v", rev, out.Ready)
	}
	if o := g.request(svc, "", "/", client).Do(ctx); !o.OK() || o.App != "docker" {
		t.Fatalf("request through the gateway: %s, app %q", o.Describe(), o.App)
	}
	alloc := h.waitRunning(rev, 1, 30*time.Second)[0].ID
	allocs = append(allocs, alloc)
	user, proxy := h.allocContainers(dc, alloc)
	appPort := h.allocPort(alloc, spec.PortApp)

	// The app's port 80 is published on 127.0.0.1 at the host port Nomad
	// allocated, and that is where the sidecar, in the host's network,
	// reaches it.
	if got := user.HostConfig.PortBindings["80/tcp"]; len(got) != 1 || got[0].HostIP != "127.0.0.1" || got[0].HostPort != strconv.Itoa(appPort.Value) {
		t.Errorf("user container: port 80/tcp published on %+v, want 127.0.0.1:%d (Nomad's app port)", got, appPort.Value)
	}
	if v, _ := user.EnvVar("PORT"); v != "80" {
		t.Errorf("user container: PORT=%q, want the fixed 80", v)
	}
	if user.HostConfig.NetworkMode == "host" {
		t.Errorf("user container runs in the host's network; a fixed port would collide between instances")
	}
	if proxy.HostConfig.NetworkMode != "host" {
		t.Errorf("sidecar container network %q, want host", proxy.HostConfig.NetworkMode)
	}
	appHost, _ := proxy.EnvVar(spec.EnvSidecarAppHost)
	appPortEnv, _ := proxy.EnvVar(spec.EnvSidecarAppPort)
	if appHost != "127.0.0.1" || appPortEnv != strconv.Itoa(appPort.Value) {
		t.Errorf("sidecar reaches the app at %s:%s, want 127.0.0.1:%d", appHost, appPortEnv, appPort.Value)
	}
	if st := h.appStats(alloc); st.Requests < 1 {
		t.Errorf("the app, asked directly at its published port, counted %d requests", st.Requests)
	}
	for _, c := range []ContainerInfo{user, proxy} {
		if c.Config.Image != image {
			t.Errorf("%s runs image %s, want %s", c.Name, c.Config.Image, image)
		}
	}
	if user.Path != "/usr/local/bin/nomad-serverless" || !slices.Equal(user.Args, []string{"testapp"}) ||
		!slices.Equal(proxy.Args, []string{"sidecar"}) {
		t.Errorf("commands: user %s %v, sidecar %s %v", user.Path, user.Args, proxy.Path, proxy.Args)
	}
	h.checkNonRoot(ownDockerd, user, proxy)

	// The queue-proxy starts with the app where the engine announces a
	// container's address (docker 28 and later), after it otherwise.
	engine, err := dc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	job, _, err := h.nomad.Jobs().Info(rev, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lifecycle *nomad.TaskLifecycle
	for _, task := range job.TaskGroups[0].Tasks {
		if task.Name == spec.SidecarTaskName {
			lifecycle = task.Lifecycle
		}
	}
	besideApp := nomadjob.DockerAnnounces([]nomadjob.DockerEngine{{Node: "dev", Version: engine}})
	if besideApp != (lifecycle == nil) || !besideApp && (lifecycle.Hook != nomad.TaskLifecycleHookPoststart || !lifecycle.Sidecar) {
		t.Errorf("docker %s: the queue-proxy's lifecycle is %+v; want it started with the app: %v", engine, lifecycle, besideApp)
	}
	order := map[bool]string{true: "with the app", false: "after the app (poststart)"}[besideApp]
	h.s.Timings.Note(h.scenario, StageFirstByte, fmt.Sprintf("docker %s: queue-proxy started %s", engine, order))
	t.Logf("docker %s: the queue-proxy starts %s", engine, order)

	// Nomad collects no log of the queue-proxy; it writes its own where
	// Nomad would, as the image's non-root user, and logs reads it.
	eventually(t, 30*time.Second, "logs -sidecar shows the docker sidecar's own log", func() (bool, string) {
		out, errOut, code := h.cli("logs", "-follow=false", "-since", "10m", "-sidecar", "-stderr", "-revision", rev, svc)
		return code == 0 && strings.Contains(out, "["+alloc[:8]+"] {") && strings.Contains(out, `"msg":`), fmt.Sprintf("exit %d: %q %s", code, out, errOut)
	})

	// Resources reach the containers: memory is docker's hard limit, cpu
	// its shares.
	const mib = 1 << 20
	for _, c := range []struct {
		name        string
		info        ContainerInfo
		memory, cpu int64
	}{{"user", user, 96 * mib, 50}, {"queue-proxy", proxy, 64 * mib, 50}} {
		hc := c.info.HostConfig
		t.Logf("%s container: memory limit %d MiB, reservation %d, cpu shares %d", c.name, hc.Memory/mib, hc.MemoryReservation, hc.CPUShares)
		if hc.Memory != c.memory || hc.CPUShares != c.cpu {
			t.Errorf("%s container: memory limit %d bytes and cpu shares %d, want %d (%d MiB) and %d", c.name, hc.Memory, hc.CPUShares, c.memory, c.memory/mib, c.cpu)
		}
	}
	h.s.Timings.Note(h.scenario, "deploy -> ready", fmt.Sprintf("user container memory limit %d MiB (resources.memory 96), sidecar %d MiB", user.HostConfig.Memory/mib, proxy.HostConfig.Memory/mib))

	// Scale to zero and wake, 5 times. Only scaling changes, so the
	// revision is updated in place.
	s.Scaling.Min = 0
	h.deployImage(h.writeDockerServices("docker.hcl", s), image)
	const wakes = 10
	var firstBytes []string
	for i := 1; i <= wakes; i++ {
		took := h.waitZero(rev, 90*time.Second)
		if i == 1 {
			h.timing("min 0 -> zero (window 6s, grace 2s)", took)
		}
		cs := h.wake(g, svc, rev, "docker")
		for _, st := range cs.Split() {
			if st.Known {
				h.timing(st.Name, st.Since)
			}
		}
		if !cs.ScaleCall.IsZero() && !cs.FirstByte.IsZero() {
			h.timing("scale call -> first byte", cs.FirstByte.Sub(cs.ScaleCall))
		}
		t.Logf("wake %d: %v (load average %s)", i, cs.Split(), loadAverage())
		firstBytes = append(firstBytes, FormatDuration(cs.FirstByte.Sub(cs.RequestIn)))
	}
	for _, r := range h.s.Timings.Rows() {
		if r.Scenario == h.scenario && r.Measure == StageFirstByte {
			target := ColdStartTarget("docker")
			verdict := "met"
			if Median(r.Values) > target {
				verdict = "MISSED"
			}
			h.s.Timings.Note(h.scenario, StageFirstByte, fmt.Sprintf("target <= %s median of %d: %s", target, len(r.Values), verdict))
			t.Logf("cold starts to the first byte: %s (median %s, target <= %s: %s)", strings.Join(firstBytes, " "), FormatDuration(Median(r.Values)), target, verdict)
		}
	}

	// Bridge networking: the allocation gets its own network namespace
	// (a pause container holds it); the app listens on its fixed port
	// inside it, and only the sidecar's ports are mapped to the host.
	const bsvc = "e2e-docker-bridge"
	if cniPath == "" {
		t.Logf("docker bridge networking: SKIPPED: %s", noCNI)
	} else {
		brev := revision(bsvc, 1)
		h.cleanupService(bsvc)
		b := DockerService{
			Name: bsvc, Image: image, Args: []string{"testapp"}, Port: 8080, Bridge: true,
			Env: map[string]string{"TESTAPP_NAME": "bridge"}, // on 127.0.0.1 of its namespace
			CPU: 50, MemoryMB: 80, Concurrency: 10, Scaling: FastScaling(),
		}
		b.Scaling.Min = 1
		start = time.Now()
		out := h.deployImage(h.writeDockerServices("bridge.hcl", b), image)
		h.timing("bridge: deploy -> ready", time.Since(start))
		if r := out.Ready[brev]; r.Passing != 1 {
			t.Fatalf("deploy did not report %s ready with 1 instance: %+v", brev, out.Ready)
		}
		if o := g.request(bsvc, "", "/", client).Do(ctx); !o.OK() || o.App != "bridge" {
			t.Fatalf("bridge: request through the gateway: %s, app %q", o.Describe(), o.App)
		}
		balloc := h.waitRunning(brev, 1, 30*time.Second)[0].ID
		allocs = append(allocs, balloc)
		h.checkBridge(dc, ownDockerd, balloc, pauseImage, b.Port)
	}

	// A real app in docker: an init step (raw_exec) writes into the
	// allocation's shared directory, a host volume is mounted read-only
	// into the app's container, and the app serves both; it wakes from
	// zero with the init step in the way.
	const rsvc = "e2e-docker-realapp"
	h.cleanupService(rsvc)
	rrev := revision(rsvc, 1)
	start = time.Now()
	out = h.deployImage(h.writeRaw("realapp-docker.hcl", dockerRealApp(rsvc, image)), image)
	h.timing("real app: deploy -> ready", time.Since(start))
	if r := out.Ready[rrev]; r.Passing != 1 {
		t.Fatalf("deploy did not report %s ready with 1 instance: %+v", rrev, out.Ready)
	}
	ralloc := h.waitRunning(rrev, 1, 30*time.Second)[0].ID
	allocs = append(allocs, ralloc)
	for _, want := range []struct{ path, content string }{
		{"/data/hello.txt", "hello from the host volume"},
		{"/alloc/data/migration.txt", "migrated by " + ralloc},
	} {
		if code, body := getHost(g, rsvc, "/file?path="+want.path); code != 200 || strings.TrimSpace(body) != want.content {
			t.Errorf("real app: %s: %d %q, want %q", want.path, code, body, want.content)
		}
	}
	if user, _ := h.allocContainers(dc, ralloc); !hasMount(user, volDir, "/data", false) {
		t.Errorf("real app: the app's container does not mount %s read-only at /data: %+v", volDir, user.Mounts)
	}
	h.waitZero(rrev, 90*time.Second)
	cs := h.wake(g, rsvc, rrev, "docker+init")
	t.Logf("real app wake: %v", cs.Split())
	if _, ok := h.lastWake(rsvc, rrev).At(spec.WakeInitDone); !ok {
		t.Errorf("real app: the wake's timeline has no %s step", spec.WakeInitDone)
	}
	if code, body := getHost(g, rsvc, "/file?path=/data/hello.txt"); code != 200 {
		t.Errorf("real app after the wake: %d %q", code, body)
	}

	// delete: every revision job purged, and then no container of the
	// scenario's allocations runs (their pause containers included).
	// Every allocation either job ever had (the wakes' too).
	var revs []string
	for _, name := range []string{svc, bsvc, rsvc} {
		for _, a := range h.allocIDs(revision(name, 1)) {
			if !slices.Contains(allocs, a) {
				allocs = append(allocs, a)
			}
		}
		revs = append(revs, revision(name, 1))
		h.mustCLI("delete", name)
	}
	start = time.Now()
	eventually(t, 90*time.Second, "no container of the scenario's allocations runs after delete", func() (bool, string) {
		running, err := dc.Containers(ctx, false, nomadAllocLabel)
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, c := range running {
			if slices.Contains(allocs, c.Labels[nomadAllocLabel]) {
				left = append(left, c.Name()+" ("+c.State+")")
			}
		}
		return len(left) == 0, fmt.Sprintf("running: %v", left)
	})
	h.timing("delete -> no container running", time.Since(start))
	all, err := dc.Containers(ctx, true, nomadAllocLabel)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, c := range all {
		if slices.Contains(allocs, c.Labels[nomadAllocLabel]) {
			kept = append(kept, c.Name()+" ("+c.State+")")
		}
	}
	if len(kept) > 0 {
		t.Logf("stopped containers still listed after delete (Nomad removes them when it collects the allocation): %v", kept)
	}
	for _, name := range []string{svc, bsvc, rsvc} {
		if found, checked := h.leftovers(name, revs); len(found) > 0 {
			t.Errorf("delete %s left:\n  %s", name, strings.Join(checked, "\n  "))
		}
	}
	h.s.Timings.Note(h.scenario, "delete -> no container running", fmt.Sprintf("%d allocations' containers checked", len(allocs)))
}

// dockerRealApp is a docker app with an init step and a host volume.
func dockerRealApp(name, image string) string {
	return fmt.Sprintf(`service %q {
  task {
    driver = "docker"
    config {
      image = %q
      args  = ["testapp"]
    }
    port = 80
    env {
      TESTAPP_HOST = "0.0.0.0"
    }
    resources {
      cpu    = 50
      memory = 80
    }
    kill_timeout = "5s"
    volume_mount {
      volume      = "data"
      destination = "/data"
      read_only   = true
    }
  }

  task "migrate" {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", "echo \"migrated by $NOMAD_ALLOC_ID\" > \"$NOMAD_ALLOC_DIR/data/migration.txt\""]
    }
    lifecycle { hook = "prestart" }
    resources {
      cpu    = 20
      memory = 32
    }
  }

  volume "data" {
    type      = "host"
    source    = "e2e-data"
    read_only = true
  }
`+realAppReadinessAndScaling, name, image)
}

// writeRaw writes a service file as given into the scenario's directory.
func (h *harness) writeRaw(name, src string) string {
	h.t.Helper()
	path := filepath.Join(h.dir, name)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return path
}

// hasMount reports whether a container mounts source at destination,
// read-write or not as rw says.
func hasMount(c ContainerInfo, source, destination string, rw bool) bool {
	for _, m := range c.Mounts {
		if m.Source == source && m.Destination == destination && m.RW == rw {
			return true
		}
	}
	return false
}

// loadAverage is the machine's 1-minute load average ("?" if unknown): a
// cold start on a busy 2-core machine says more with it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// deployImage deploys a file with the image as the sidecar (docker) and
// returns deploy's output, read back.
// scratchDir makes a short temporary directory (the unix sockets of
// dockerd, containerd and Nomad's tasks live below it, and a socket's path
// has 108 bytes at most). When the test ends, after everything else, it
// unmounts what is still mounted below it and removes it, or keeps it
// and says so (what) when the test failed or -keep is set.
func (h *harness) scratchDir(prefix, what string) string {
	t := h.t
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := UnmountUnder(dir); err != nil {
			t.Logf("unmount below %s: %v", dir, err)
		}
		if t.Failed() || *keepData {
			t.Logf("%s kept in %s", what, dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// dockerd is the DOCKER_HOST a scenario uses: the running dockerd the plan
// found, or one started below dir (own), stopped when the test ends.
func (h *harness) dockerd(ctx context.Context, plan DockerPlan, dir string) (host string, own bool) {
	t := h.t
	t.Helper()
	if plan.Host != "" {
		t.Logf("using the running dockerd at %s", plan.Host)
		return plan.Host, false
	}
	start := time.Now()
	d, err := StartDockerd(ctx, plan.Dockerd, dir, h.s.Guard)
	if err != nil {
		t.Fatalf("start dockerd: %v", err)
	}
	t.Cleanup(func() {
		if d.Stop(40 * time.Second) {
			t.Errorf("dockerd did not stop within 40s after SIGINT; killed it (log %s)", d.LogPath)
		}
	})
	h.timing("start dockerd", time.Since(start))
	t.Logf("dockerd %s started: DOCKER_HOST=%s docker ps (log %s)", plan.Dockerd, d.Host, d.LogPath)
	return d.Host, true
}

func (h *harness) deployImage(file, image string) DeployOutput {
	h.t.Helper()
	return ParseDeployOutput(h.mustCLI("deploy", "-sidecar-image", image, "-wait", "3m", file))
}

// writeDockerServices writes docker services into the scenario's
// directory.
func (h *harness) writeDockerServices(name string, services ...DockerService) string {
	h.t.Helper()
	path, err := WriteDockerServiceFile(h.dir, name, services...)
	if err != nil {
		h.t.Fatal(err)
	}
	return path
}

// buildImages builds the image of the binary under test from
// deploy/Dockerfile.scratch and the pause image. The binary must be static
// to run FROM scratch; the suite's own build (testbin) may not be, and
// then it is built again as `make build` builds it.
func (h *harness) buildImages(dc *DockerClient, dir, image, pauseImage string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := h.bin
	if static, err := IsStatic(bin); err != nil || !static {
		root, err := testbin.ModuleRoot()
		if err != nil {
			h.t.Fatal(err)
		}
		bin = filepath.Join(dir, "nomad-serverless")
		start := time.Now()
		if err := BuildStatic(ctx, root, bin); err != nil {
			h.t.Fatal(err)
		}
		h.t.Logf("%s is not static (cgo); built a static copy (CGO_ENABLED=0) in %s", h.bin, time.Since(start).Round(time.Millisecond))
	}
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			h.t.Fatal(err)
		}
		return b
	}
	bctx, err := BuildContext(
		ContextFile{Name: "Dockerfile.scratch", Mode: 0o644, Data: read(filepath.Join("..", "deploy", "Dockerfile.scratch"))},
		ContextFile{Name: "nomad-serverless", Mode: 0o755, Data: read(bin)},
	)
	if err != nil {
		h.t.Fatal(err)
	}
	id, err := dc.Build(ctx, image, "Dockerfile.scratch", bctx)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("built %s (%.19s) from deploy/Dockerfile.scratch", image, id)

	pause, err := BuildPause(ctx, dir)
	if err != nil {
		h.t.Fatal(err)
	}
	pctx, err := BuildContext(
		ContextFile{Name: "Dockerfile", Mode: 0o644, Data: []byte(PauseDockerfile)},
		ContextFile{Name: "pause", Mode: 0o755, Data: read(pause)},
	)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := dc.Build(ctx, pauseImage, "Dockerfile", pctx); err != nil {
		h.t.Fatal(err)
	}
}

// checkImageLikeDockerfile checks the image against the final stage of
// the repository's Dockerfile (which needs images that cannot be pulled
// here): same entrypoint, default command, ports and user, and run with no
// arguments it is `serve`.
func (h *harness) checkImageLikeDockerfile(dc *DockerClient, image string) {
	h.t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		h.t.Fatal(err)
	}
	want, err := ParseDockerfile(string(src))
	if err != nil {
		h.t.Fatalf("Dockerfile: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, err := dc.Image(ctx, image)
	if err != nil {
		h.t.Fatal(err)
	}
	var ports []string
	for p := range img.Config.ExposedPorts {
		ports = append(ports, strings.TrimSuffix(p, "/tcp"))
	}
	slices.Sort(ports)
	if !slices.Equal(img.Config.Entrypoint, want.Entrypoint) || !slices.Equal(img.Config.Cmd, want.Cmd) || !slices.Equal(ports, want.Expose) ||
		img.Config.User != distrolessUsers[want.User] {
		h.t.Errorf("image %s: entrypoint %q cmd %q ports %v user %q; the Dockerfile's: %q %q %v %q (%s)",
			image, img.Config.Entrypoint, img.Config.Cmd, ports, img.Config.User, want.Entrypoint, want.Cmd, want.Expose, want.User, distrolessUsers[want.User])
	}
	// With no arguments it runs serve, which (no network) says it cannot
	// reach Consul and exits.
	res, err := dc.RunToEnd(ctx, image, nil)
	if err != nil {
		h.t.Fatalf("run %s with its default command: %v", image, err)
	}
	h.t.Logf("docker run %s (no arguments, no network): exit %d: %s", image, res.ExitCode, strings.TrimSpace(res.Output))
	if res.Info.Path != want.Entrypoint[0] || !slices.Equal(res.Info.Args, want.Cmd) || !strings.Contains(res.Output, "nomad-serverless serve") {
		h.t.Errorf("run with no arguments: ran %s %v, output %q; want %v %v, which is serve", res.Info.Path, res.Info.Args, res.Output, want.Entrypoint, want.Cmd)
	}
}

// checkNonRoot checks the containers' user: the image's (non-root), and,
// with a dockerd of this machine, the real user of their processes.
func (h *harness) checkNonRoot(local bool, cs ...ContainerInfo) {
	h.t.Helper()
	for _, c := range cs {
		if c.Config.User != "65532:65532" {
			h.t.Errorf("%s runs as %q, want the image's non-root 65532:65532", c.Name, c.Config.User)
		}
		if !local || c.State.Pid == 0 {
			continue
		}
		if uid, err := ProcessUID(c.State.Pid); err != nil || uid != 65532 {
			h.t.Errorf("%s: process %d runs as uid %d (%v), want 65532", c.Name, c.State.Pid, uid, err)
		}
	}
}

// allocContainers waits for the user and sidecar containers of an
// allocation to run and inspects them.
func (h *harness) allocContainers(dc *DockerClient, alloc string) (user, proxy ContainerInfo) {
	h.t.Helper()
	ctx := context.Background()
	eventually(h.t, 30*time.Second, "dockerd runs the user and sidecar containers of "+alloc, func() (bool, string) {
		cs, err := dc.Containers(ctx, false, nomadAllocLabel+"="+alloc)
		if err != nil {
			return false, err.Error()
		}
		var names []string
		var u, p string
		for _, c := range cs {
			names = append(names, c.Name())
			switch c.Name() {
			case spec.UserTaskName + "-" + alloc:
				u = c.ID
			case spec.SidecarTaskName + "-" + alloc:
				p = c.ID
			}
		}
		if u == "" || p == "" {
			return false, fmt.Sprintf("running containers of the allocation: %v", names)
		}
		if user, err = dc.Container(ctx, u); err != nil {
			return false, err.Error()
		}
		if proxy, err = dc.Container(ctx, p); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return user, proxy
}

// allocPort is the allocation's port with a label (fails without it).
func (h *harness) allocPort(alloc, label string) nomad.PortMapping {
	h.t.Helper()
	for _, p := range h.allocPorts(alloc) {
		if p.Label == label {
			return p
		}
	}
	h.t.Fatalf("allocation %s has no %q port", alloc, label)
	return nomad.PortMapping{}
}

// allocPorts are the allocation's ports.
func (h *harness) allocPorts(alloc string) []nomad.PortMapping {
	h.t.Helper()
	a, _, err := h.nomad.Allocations().Info(alloc, nil)
	if err != nil {
		h.t.Fatalf("allocation %s: %v", alloc, err)
	}
	if a.AllocatedResources == nil {
		h.t.Fatalf("allocation %s has no allocated resources", alloc)
	}
	return a.AllocatedResources.Shared.Ports
}

// allocIDs are the IDs of every allocation of a job, stopped ones too.
func (h *harness) allocIDs(job string) []string {
	h.t.Helper()
	as, _, err := h.nomad.Jobs().Allocations(job, true, nil)
	if err != nil {
		return nil
	}
	var ids []string
	for _, a := range as {
		ids = append(ids, a.ID)
	}
	return ids
}

// checkBridge checks a bridge allocation: Nomad maps only the sidecar's
// ports; a pause container holds the namespace and both tasks join it; no
// container publishes anything; the app's port is not reachable at the
// allocation's address (the app listens on the namespace's loopback).
func (h *harness) checkBridge(dc *DockerClient, local bool, alloc, pauseImage string, appPort int) {
	h.t.Helper()
	ctx := context.Background()
	var labels []string
	for _, p := range h.allocPorts(alloc) {
		labels = append(labels, fmt.Sprintf("%s=%s:%d", p.Label, p.HostIP, p.Value))
		if p.Label == spec.PortApp || p.To == appPort || p.Value == appPort {
			h.t.Errorf("bridge allocation exposes the app's port: %+v", p)
		}
	}
	if len(labels) != 2 {
		h.t.Errorf("bridge allocation ports %v, want the sidecar's http and admin only", labels)
	}
	a, _, err := h.nomad.Allocations().Info(alloc, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	var nsAddr string
	if a.NetworkStatus != nil {
		nsAddr = a.NetworkStatus.Address
	}
	user, proxy := h.allocContainers(dc, alloc)
	pauses, err := dc.Containers(ctx, false, nomadAllocLabel+"="+alloc)
	if err != nil {
		h.t.Fatal(err)
	}
	var pause *ContainerInfo
	for _, c := range pauses {
		if c.Image == pauseImage {
			info, err := dc.Container(ctx, c.ID)
			if err != nil {
				h.t.Fatal(err)
			}
			pause = &info
		}
	}
	if pause == nil {
		h.t.Fatalf("no pause container (%s) runs for bridge allocation %s", pauseImage, alloc)
	}
	for _, c := range []ContainerInfo{user, proxy} {
		if c.HostConfig.NetworkMode != "container:"+pause.ID {
			h.t.Errorf("%s network %q, want the pause container's namespace (container:%.12s)", c.Name, c.HostConfig.NetworkMode, pause.ID)
		}
	}
	for _, c := range []ContainerInfo{user, proxy, *pause} {
		for port, b := range c.HostConfig.PortBindings {
			if len(b) > 0 {
				h.t.Errorf("%s publishes %s on %+v; in bridge mode Nomad maps ports through CNI, and only the sidecar's", c.Name, port, b)
			}
		}
	}
	if nsAddr == "" {
		h.t.Errorf("bridge allocation %s reports no address for its namespace", alloc)
	} else if conn, err := net.DialTimeout("tcp", net.JoinHostPort(nsAddr, strconv.Itoa(appPort)), time.Second); err == nil {
		conn.Close()
		h.t.Errorf("the app's port %d answers at the allocation's address %s: it should be internal", appPort, nsAddr)
	}
	h.t.Logf("bridge allocation %.8s: namespace %s (pause %.12s), ports %v; user memory limit %d MiB", alloc, nsAddr, pause.ID, labels, user.HostConfig.Memory>>20)
	if user.HostConfig.Memory != 80<<20 {
		h.t.Errorf("bridge user container memory limit %d, want 80 MiB", user.HostConfig.Memory)
	}
	h.checkNonRoot(local, user, proxy)
}
