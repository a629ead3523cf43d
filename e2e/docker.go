package e2e

// Helpers of the docker scenario (18): where dockerd is, starting one, a
// small client of its Engine API (plain HTTP on its unix socket: no docker
// CLI, whose version and builder differ from machine to machine), the
// images built from the binary under test FROM scratch, the final stage of
// a Dockerfile read back, and docker services in the service language.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// DefaultDockerHost is where dockerd listens unless DOCKER_HOST says
// otherwise.
const DefaultDockerHost = "unix:///var/run/docker.sock"

// DockerPlan is where the docker scenario gets dockerd from.
type DockerPlan struct {
	// Host is a dockerd that answers (DOCKER_HOST, or the default socket).
	Host string
	// Dockerd, when Host is "", is the dockerd binary to start.
	Dockerd string
	// Skip, when set, says in one line why the scenario does not run.
	Skip string
}

// DecideDocker picks dockerd: the one DOCKER_HOST names (it must answer),
// else one answering on the default socket, else a dockerd binary on PATH
// to start, else a skip. ping is DockerClient.Ping in the suite.
func DecideDocker(getenv func(string) string, lookPath func(string) (string, error), ping func(host string) error) DockerPlan {
	if h := getenv("DOCKER_HOST"); h != "" {
		if !strings.HasPrefix(h, "unix://") {
			return DockerPlan{Skip: fmt.Sprintf("docker: SKIPPED: DOCKER_HOST=%s: the suite talks to dockerd on a unix socket only (unix:///path/docker.sock)", h)}
		}
		if err := ping(h); err != nil {
			return DockerPlan{Skip: fmt.Sprintf("docker: SKIPPED: DOCKER_HOST=%s does not answer: %v", h, oneLine(err.Error()))}
		}
		return DockerPlan{Host: h}
	}
	if err := ping(DefaultDockerHost); err == nil {
		return DockerPlan{Host: DefaultDockerHost}
	}
	if bin, err := lookPath("dockerd"); err == nil {
		return DockerPlan{Dockerd: bin}
	}
	return DockerPlan{Skip: "docker: SKIPPED: no dockerd answers at " + DefaultDockerHost + " and dockerd is not on PATH (Debian: apt-get install docker.io)"}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Dockerd is a dockerd the suite started.
type Dockerd struct {
	*devagents.Proc
	// Host is its API ("unix://dir/docker.sock").
	Host string
	// made are the directories outside its own that dockerd creates
	// whatever its exec root (/run/docker/plugins) and that did not exist
	// before, deepest first.
	made []string
}

// runDockerDirs are made by dockerd wherever its exec root is.
var runDockerDirs = []string{"/run/docker/plugins", "/run/docker"}

// StartDockerd starts dockerd with everything of its own under dir (its
// API socket, data root, exec root and pid file; log dir/dockerd.log), so
// it touches no dockerd state of the machine's, registers it with the
// guard, and waits until it answers.
func StartDockerd(ctx context.Context, bin, dir string, guard *devagents.Guard) (*Dockerd, error) {
	sock := filepath.Join(dir, "docker.sock")
	d := &Dockerd{Host: "unix://" + sock}
	for _, m := range runDockerDirs {
		if _, err := os.Stat(m); errors.Is(err, os.ErrNotExist) {
			d.made = append(d.made, m)
		}
	}
	p, err := devagents.StartProc(devagents.Command{
		Name: "dockerd", Path: bin, LogPath: filepath.Join(dir, "dockerd.log"),
		Args: []string{"--host", d.Host, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "dockerd.pid")},
		Env:  os.Environ(),
	})
	if err != nil {
		return nil, err
	}
	d.Proc = p
	guard.StopFirst(p.Pid(), p.Name)
	if err := devagents.WaitFor(ctx, p, "dockerd at "+d.Host, time.Minute, 100*time.Millisecond, NewDockerClient(d.Host).Ping); err != nil {
		d.Stop(30 * time.Second)
		return nil, err
	}
	return d, nil
}

// Stop stops dockerd (SIGINT: it stops its containers and its containerd,
// and unmounts; SIGKILL after grace) and removes the directories it made
// outside its own if they are empty. It reports whether dockerd had to be
// killed. Mounts may remain below dir (see UnmountUnder).
func (d *Dockerd) Stop(grace time.Duration) (killed bool) {
	killed = d.Proc.Stop(grace)
	for _, m := range d.made {
		_ = os.Remove(m) // only if empty
	}
	return killed
}

// UnmountUnder lazily unmounts every mount point below dir (deepest
// first), as read from /proc/self/mountinfo: dockerd leaves the bind mount
// of the host's network namespace in its exec root (exec/netns/default)
// when it stops, and a directory with a mount in it cannot be removed.
func UnmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		// Field 5 is the mount point (octal escapes for spaces and the
		// like; the suite's paths have none).
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// CNIPlugins are the CNI plugins Nomad's bridge networking runs.
var CNIPlugins = []string{"bridge", "firewall", "host-local", "loopback", "portmap"}

// CNIPathCandidates are where distributions put the CNI plugins: Nomad's
// default, Debian's containernetworking-plugins, Fedora's.
var CNIPathCandidates = []string{"/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni"}

// FindCNIPath returns the first directory holding every CNIPlugins, or ""
// with the line saying so.
func FindCNIPath(dirs []string) (string, string) {
	for _, d := range dirs {
		ok := true
		for _, p := range CNIPlugins {
			if fi, err := os.Stat(filepath.Join(d, p)); err != nil || fi.IsDir() {
				ok = false
				break
			}
		}
		if ok {
			return d, ""
		}
	}
	return "", fmt.Sprintf("the CNI plugins %s are not all in any of %s (Debian: apt-get install containernetworking-plugins)", strings.Join(CNIPlugins, ", "), strings.Join(dirs, ", "))
}

// IsStatic reports whether an ELF executable asks for no program
// interpreter, so it runs in an image FROM scratch.
func IsStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// BuildStatic builds the binary exactly as `make build` does (CGO_ENABLED=0:
// a static binary; the same flags, so every package comes from the build
// cache `make build` filled and only the link runs) into out, from the
// module at root.
func BuildStatic(ctx context.Context, root, out string) error {
	return goBuild(ctx, root, out, "./cmd/nomad-serverless")
}

// pauseSource is the pause container's program: it holds a bridge
// allocation's network namespace and waits to be stopped. Nomad's default
// infra image (gcr.io/google_containers/pause) cannot be pulled offline.
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
`

// BuildPause writes and builds the pause program into dir/pause and
// returns its path.
func BuildPause(ctx context.Context, dir string) (string, error) {
	if err := os.WriteFile(filepath.Join(dir, "pause.go"), []byte(pauseSource), 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause")
	return out, goBuild(ctx, dir, out, "pause.go")
}

func goBuild(ctx context.Context, dir, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("CGO_ENABLED=0 go build -o %s %s in %s: %v\n%s", out, pkg, dir, err, b)
	}
	return nil
}

// ContextFile is one file of a build context.
type ContextFile struct {
	Name string
	Mode int64
	Data []byte
}

// BuildContext is a tar of files, as the Engine API's build takes it.
func BuildContext(files ...ContextFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.Name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// PauseDockerfile builds the pause image from a context holding "pause".
const PauseDockerfile = "FROM scratch\nCOPY pause /pause\nUSER 65532:65532\nENTRYPOINT [\"/pause\"]\n"

// DockerClient speaks dockerd's Engine API on its unix socket.
type DockerClient struct {
	Host string
	c    *http.Client
}

// NewDockerClient returns a client of the dockerd at host
// ("unix:///path/docker.sock").
func NewDockerClient(host string) *DockerClient {
	sock := strings.TrimPrefix(host, "unix://")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return &DockerClient{Host: host, c: &http.Client{Transport: tr}}
}

// PingHost is DockerClient.Ping of a host, with a short bound.
func PingHost(host string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return NewDockerClient(host).Ping(ctx)
}

// DockerError is an answer other than the one expected.
type DockerError struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *DockerError) Error() string {
	return fmt.Sprintf("dockerd: %s %s: %d %s", e.Method, e.Path, e.Status, e.Message)
}

// do sends a request; want is the status expected; out, when not nil,
// receives the JSON answer.
func (d *DockerClient) do(ctx context.Context, method, path string, body io.Reader, contentType string, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, body)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := d.c.Do(req)
	if err != nil {
		return fmt.Errorf("dockerd at %s: %w", d.Host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		var m struct{ Message string }
		if json.Unmarshal(b, &m) != nil || m.Message == "" {
			m.Message = strings.TrimSpace(string(b))
		}
		return &DockerError{Method: method, Path: path, Status: resp.StatusCode, Message: m.Message}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("dockerd: %s %s: %w: %.200s", method, path, err, b)
		}
	}
	return nil
}

// Ping checks that dockerd answers.
func (d *DockerClient) Ping(ctx context.Context) error {
	return d.do(ctx, http.MethodGet, "/_ping", nil, "", http.StatusOK, nil)
}

// Version is the engine's version ("28.5.2").
func (d *DockerClient) Version(ctx context.Context) (string, error) {
	var v struct{ Version string }
	err := d.do(ctx, http.MethodGet, "/version", nil, "", http.StatusOK, &v)
	return v.Version, err
}

// Build builds an image tagged tag from a build context tar whose
// Dockerfile is named dockerfile, and returns the image's ID. dockerd
// reports a failed step in the answer's stream, not its status.
func (d *DockerClient) Build(ctx context.Context, tag, dockerfile string, buildContext []byte) (string, error) {
	q := url.Values{"t": {tag}, "dockerfile": {dockerfile}, "rm": {"1"}, "forcerm": {"1"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://docker/build?"+q.Encode(), bytes.NewReader(buildContext))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := d.c.Do(req)
	if err != nil {
		return "", fmt.Errorf("dockerd at %s: build %s: %w", d.Host, tag, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return "", fmt.Errorf("dockerd: build %s: %s: %s", tag, resp.Status, strings.TrimSpace(string(b)))
	}
	var log strings.Builder
	var id string
	dec := json.NewDecoder(resp.Body)
	for {
		var m struct {
			Stream, Error string
			Aux           struct{ ID string }
		}
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("dockerd: build %s: %w", tag, err)
		}
		log.WriteString(m.Stream)
		if m.Error != "" {
			return "", fmt.Errorf("dockerd: build %s: %s\n%s", tag, m.Error, log.String())
		}
		if m.Aux.ID != "" {
			id = m.Aux.ID
		}
	}
	if id == "" {
		img, err := d.Image(ctx, tag)
		if err != nil {
			return "", fmt.Errorf("dockerd: build %s: no image ID in the answer: %w\n%s", tag, err, log.String())
		}
		id = img.ID
	}
	return id, nil
}

// ImageInfo is the part of an image's inspection the scenario reads.
type ImageInfo struct {
	ID     string `json:"Id"`
	Config struct {
		User         string
		Entrypoint   []string
		Cmd          []string
		ExposedPorts map[string]struct{}
	}
}

// Image inspects an image.
func (d *DockerClient) Image(ctx context.Context, ref string) (ImageInfo, error) {
	var img ImageInfo
	err := d.do(ctx, http.MethodGet, "/images/"+ref+"/json", nil, "", http.StatusOK, &img)
	return img, err
}

// RemoveImage removes an image (force: every tag of it).
func (d *DockerClient) RemoveImage(ctx context.Context, ref string) error {
	return d.do(ctx, http.MethodDelete, "/images/"+ref+"?force=1", nil, "", http.StatusOK, nil)
}

// ContainerSummary is one container of a list.
type ContainerSummary struct {
	ID     string `json:"Id"`
	Names  []string
	Image  string
	State  string
	Labels map[string]string
}

// Name is the container's name without the leading slash.
func (c ContainerSummary) Name() string {
	if len(c.Names) == 0 {
		return c.ID
	}
	return strings.TrimPrefix(c.Names[0], "/")
}

// Containers lists the running containers (every one with all), only those
// with every label given ("key=value" or "key").
func (d *DockerClient) Containers(ctx context.Context, all bool, labels ...string) ([]ContainerSummary, error) {
	q := url.Values{}
	if all {
		q.Set("all", "1")
	}
	if len(labels) > 0 {
		f, _ := json.Marshal(map[string][]string{"label": labels})
		q.Set("filters", string(f))
	}
	var cs []ContainerSummary
	err := d.do(ctx, http.MethodGet, "/containers/json?"+q.Encode(), nil, "", http.StatusOK, &cs)
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name() < cs[j].Name() })
	return cs, err
}

// PortBinding is one host address a container port is published on.
type PortBinding struct {
	HostIP   string `json:"HostIp"`
	HostPort string
}

// ContainerInfo is the part of a container's inspection the scenario reads.
type ContainerInfo struct {
	ID    string `json:"Id"`
	Name  string
	Path  string
	Args  []string
	State struct {
		Status   string
		Running  bool
		Pid      int
		ExitCode int
	}
	Config struct {
		User   string
		Image  string
		Env    []string
		Labels map[string]string
	}
	HostConfig struct {
		Memory            int64
		MemoryReservation int64
		CPUShares         int64 `json:"CpuShares"`
		NetworkMode       string
		PortBindings      map[string][]PortBinding
	}
	// Mounts are the container's mounts (bind mounts of volumes, the
	// allocation's directories).
	Mounts []struct {
		Type, Source, Destination string
		RW                        bool
	}
}

// EnvVar is the value of an environment variable of the container's
// configuration ("" and false when it has none).
func (c ContainerInfo) EnvVar(name string) (string, bool) {
	for _, kv := range c.Config.Env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v, true
		}
	}
	return "", false
}

// Container inspects a container.
func (d *DockerClient) Container(ctx context.Context, id string) (ContainerInfo, error) {
	var c ContainerInfo
	err := d.do(ctx, http.MethodGet, "/containers/"+id+"/json", nil, "", http.StatusOK, &c)
	return c, err
}

// RunResult is a container run to its end.
type RunResult struct {
	Info     ContainerInfo // inspected once it exited
	ExitCode int
	Output   string // stdout and stderr
}

// RunToEnd creates a container of image with no network and its default
// command (cmd nil) or cmd, starts it, waits for its end within ctx, and
// removes it.
func (d *DockerClient) RunToEnd(ctx context.Context, image string, cmd []string) (RunResult, error) {
	var res RunResult
	body, _ := json.Marshal(map[string]any{"Image": image, "Cmd": cmd, "HostConfig": map[string]any{"NetworkMode": "none"}})
	var created struct {
		ID string `json:"Id"`
	}
	if err := d.do(ctx, http.MethodPost, "/containers/create", bytes.NewReader(body), "application/json", http.StatusCreated, &created); err != nil {
		return res, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.do(rctx, http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, "", http.StatusNoContent, nil)
	}()
	if err := d.do(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, "", http.StatusNoContent, nil); err != nil {
		return res, err
	}
	var waited struct{ StatusCode int }
	if err := d.do(ctx, http.MethodPost, "/containers/"+created.ID+"/wait", nil, "", http.StatusOK, &waited); err != nil {
		return res, err
	}
	res.ExitCode = waited.StatusCode
	var err error
	if res.Info, err = d.Container(ctx, created.ID); err != nil {
		return res, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/containers/"+created.ID+"/logs?stdout=1&stderr=1", nil)
	if err != nil {
		return res, err
	}
	resp, err := d.c.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	res.Output, err = demuxLogs(resp.Body)
	return res, err
}

// demuxLogs reads the logs of a container without a TTY: frames of an
// 8-byte header (stream, 3 zero bytes, big-endian length) and the bytes.
func demuxLogs(r io.Reader) (string, error) {
	var out strings.Builder
	br := bufio.NewReader(r)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err == io.EOF {
			return out.String(), nil
		} else if err != nil {
			return out.String(), err
		}
		n := binary.BigEndian.Uint32(hdr[4:])
		if _, err := io.CopyN(&out, br, int64(n)); err != nil {
			return out.String(), err
		}
	}
}

// ProcessUID is the real user ID of a process of this machine, from
// /proc/<pid>/status.
func ProcessUID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no Uid line", pid)
}

// DockerfileStage is what the final stage of a Dockerfile gives the
// containers of its image.
type DockerfileStage struct {
	From       string
	User       string
	Entrypoint []string
	Cmd        []string
	Expose     []string
	// Copies maps each COPY destination to its source (the last source
	// word; --from and other flags dropped).
	Copies map[string]string
}

// ParseDockerfile reads the final stage of a Dockerfile: FROM, USER,
// ENTRYPOINT and CMD (JSON form), EXPOSE and COPY, with comments and line
// continuations. It knows no more of the syntax than the project's files
// use, and says so rather than guess.
func ParseDockerfile(text string) (DockerfileStage, error) {
	var st DockerfileStage
	var lines []string
	var cur strings.Builder
	for _, raw := range strings.Split(text, "\n") {
		l := strings.TrimSpace(raw)
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if more, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	for _, l := range lines {
		instr, args, _ := strings.Cut(l, " ")
		args = strings.TrimSpace(args)
		switch strings.ToUpper(instr) {
		case "FROM":
			f := strings.Fields(args)
			st = DockerfileStage{From: f[0], Copies: map[string]string{}}
		case "USER":
			st.User = args
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(args), &v); err != nil {
				return st, fmt.Errorf("%s %s: only the JSON form is read: %w", instr, args, err)
			}
			if strings.EqualFold(instr, "ENTRYPOINT") {
				st.Entrypoint = v
			} else {
				st.Cmd = v
			}
		case "EXPOSE":
			st.Expose = strings.Fields(args)
		case "COPY":
			var words []string
			for _, w := range strings.Fields(args) {
				if !strings.HasPrefix(w, "--") {
					words = append(words, w)
				}
			}
			if len(words) < 2 {
				return st, fmt.Errorf("COPY %s: want a source and a destination", args)
			}
			if st.Copies == nil {
				return st, errors.New("COPY before FROM")
			}
			st.Copies[words[len(words)-1]] = words[len(words)-2]
		}
	}
	if st.From == "" {
		return st, errors.New("no FROM")
	}
	return st, nil
}

// DockerService is a test service whose task is a docker container:
// normally the image of the binary under test running `testapp`.
type DockerService struct {
	Name  string
	Image string
	Args  []string
	// Port is where the app listens inside its container (its PORT).
	Port int
	// Bridge asks for network { mode = "bridge" }.
	Bridge        bool
	Env           map[string]string
	CPU, MemoryMB int
	Concurrency   int
	Scaling       Scaling
}

// HCL renders the service block.
func (s DockerService) HCL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "service %q {\n  task {\n    driver = \"docker\"\n    config {\n", s.Name)
	fmt.Fprintf(&b, "      image = %q\n", s.Image)
	if len(s.Args) > 0 {
		q := make([]string, len(s.Args))
		for i, a := range s.Args {
			q[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&b, "      args  = [%s]\n", strings.Join(q, ", "))
	}
	b.WriteString("    }\n")
	fmt.Fprintf(&b, "    port = %d\n", s.Port)
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
	fmt.Fprintf(&b, "    resources {\n      cpu    = %d\n      memory = %d\n    }\n", s.CPU, s.MemoryMB)
	b.WriteString("    kill_timeout = \"5s\"\n  }\n\n")
	if s.Bridge {
		b.WriteString("  network {\n    mode = \"bridge\"\n  }\n\n")
	}
	b.WriteString("  readiness {\n    http {\n      path = \"/ready\"\n    }\n  }\n\n")
	if s.Concurrency > 0 {
		fmt.Fprintf(&b, "  concurrency = %d\n\n", s.Concurrency)
	}
	sc := s.Scaling
	fmt.Fprintf(&b, "  scaling {\n    min = %d\n", sc.Min)
	if sc.Max > 0 {
		fmt.Fprintf(&b, "    max = %d\n", sc.Max)
	}
	fmt.Fprintf(&b, "    initial = %d\n", sc.Initial)
	if sc.Target > 0 {
		fmt.Fprintf(&b, "    target = %g\n", sc.Target)
	}
	if sc.Window > 0 {
		fmt.Fprintf(&b, "    window = %q\n", hclDuration(sc.Window))
	}
	if sc.ScaleToZeroGrace > 0 {
		fmt.Fprintf(&b, "    scale_to_zero_grace = %q\n", hclDuration(sc.ScaleToZeroGrace))
	}
	b.WriteString("  }\n}\n")
	return b.String()
}

// WriteDockerServiceFile writes services into dir/name and returns the
// path.
func WriteDockerServiceFile(dir, name string, services ...DockerService) (string, error) {
	var parts []string
	for _, s := range services {
		parts = append(parts, s.HCL())
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte("# written by the e2e suite\n\n"+strings.Join(parts, "\n")), 0o644)
}
