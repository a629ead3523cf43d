package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// peerKind is a proxy the load runs put beside ours, in front of the same
// upstream and in the same alternating rounds, so a ratio of ours against
// it says how far from "fast" we are on this very machine (issue 16):
// HAProxy and nginx, as Debian packages them, and the reference Go loops
// (peer_goloop.go).
type peerKind struct {
	Name    string // target name and -peers name
	Bin     string // executable, looked up in PATH, then in /usr/sbin
	Package string // Debian package that installs it
	// Builtin: the benchmark's own executable runs it (Env says how);
	// there is nothing to install.
	Builtin bool
	// Env, when not nil, is its environment beyond the benchmark's, given
	// the configuration's path.
	Env func(path string) map[string]string
	// ConfigFile is the name of the file config is written to.
	ConfigFile string
	// Config renders the whole configuration: listen on listen (host:port),
	// forward every request to upstream (host:port) over kept-alive
	// connections, keep every file in dir.
	Config func(dir, listen, upstream string) string
	// Args are the arguments that run it in the foreground with the
	// configuration at path and nothing outside dir (nil: none).
	Args func(dir, path string) []string
}

// peerKinds are the peers the benchmark knows, in the order they run.
func peerKinds() []peerKind {
	return []peerKind{haproxyPeer(), nginxPeer(), goloopPeer(1), goloopPeer(2)}
}

// peerNames is every known peer's name, the default of -peers.
func peerNames() []string {
	var names []string
	for _, k := range peerKinds() {
		names = append(names, k.Name)
	}
	return names
}

// parsePeers turns -peers (comma-separated names, "" for none) into kinds.
func parsePeers(list string) ([]peerKind, error) {
	var out []peerKind
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(peerKinds(), func(k peerKind) bool { return k.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown peer %q: want some of %s", name, strings.Join(peerNames(), ","))
		}
		if !slices.ContainsFunc(out, func(k peerKind) bool { return k.Name == name }) {
			out = append(out, peerKinds()[i])
		}
	}
	return out, nil
}

// locatePeer finds k's executable: PATH first, then /usr/sbin, where Debian
// installs both peers and which a non-root PATH often lacks. When there is
// none, skip is the one line to print instead of the peer's numbers.
func locatePeer(k peerKind, lookPath func(string) (string, error)) (path, skip string) {
	if k.Builtin {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Sprintf("peer %s: cannot find the benchmark's own executable (%v); running without it", k.Name, err)
		}
		return self, ""
	}
	for _, name := range []string{k.Bin, filepath.Join("/usr/sbin", k.Bin)} {
		if p, err := lookPath(name); err == nil {
			return p, ""
		}
	}
	return "", fmt.Sprintf("peer %s: no %s in PATH or /usr/sbin (apt-get install %s); running without it", k.Name, k.Bin, k.Package)
}

// peer is one running peer proxy.
type peer struct {
	Kind peerKind
	Addr string // where it listens
	proc *proc
	dir  string // its configuration, pid file and logs
}

// peerStopTimeout bounds a peer's graceful stop before its group is killed.
const peerStopTimeout = 5 * time.Second

// startPeer writes k's configuration into a new temporary directory and
// runs bin on it, listening on a free loopback port and forwarding to
// upstream.
func startPeer(k peerKind, bin, upstream string) (*peer, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("find a port for %s: %w", k.Name, err)
	}
	dir, err := os.MkdirTemp("", "loadbench-"+k.Name+"-")
	if err != nil {
		return nil, fmt.Errorf("make the directory of %s: %w", k.Name, err)
	}
	// nginx's workers run as nobody when the benchmark runs as root, and
	// its temp paths live here.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("open the directory of %s: %w", k.Name, err)
	}
	listen := addrOf(port)
	path := filepath.Join(dir, k.ConfigFile)
	if err := os.WriteFile(path, []byte(k.Config(dir, listen, upstream)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("write the configuration of %s: %w", k.Name, err)
	}
	// Pdeathsig: a benchmark killed outright takes the peer with it.
	var args []string
	if k.Args != nil {
		args = k.Args(dir, path)
	}
	var env map[string]string
	if k.Env != nil {
		env = k.Env(path)
	}
	p, err := startProcAttr(k.Name, bin, args, env, &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	pe := &peer{Kind: k, Addr: listen, proc: p, dir: dir}
	if err := p.waitPort(port, 10*time.Second); err != nil {
		pe.stop()
		return nil, fmt.Errorf("start peer %s (%s): %w", k.Name, path, err)
	}
	return pe, nil
}

// stop stops the peer and every process it forked, and removes its
// directory. It may be called more than once.
func (p *peer) stop() {
	p.proc.stopGroup(peerStopTimeout)
	os.RemoveAll(p.dir)
}

// cpu is the CPU time the peer's processes (master and workers) have used.
func (p *peer) cpu() time.Duration {
	d, _ := groupCPUTime(p.proc.pid())
	return d
}

// startPeers starts each of kinds in front of upstream, printing one line to
// out for each that is not installed. On error it stops those it started.
func startPeers(out io.Writer, kinds []peerKind, upstream string) ([]*peer, error) {
	var peers []*peer
	for _, k := range kinds {
		bin, skip := locatePeer(k, exec.LookPath)
		if skip != "" {
			fmt.Fprintln(out, skip)
			continue
		}
		p, err := startPeer(k, bin, upstream)
		if err != nil {
			stopPeers(peers)
			return nil, err
		}
		peers = append(peers, p)
	}
	return peers, nil
}

func stopPeers(peers []*peer) {
	for _, p := range peers {
		p.stop()
	}
}
