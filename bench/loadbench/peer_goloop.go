package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

// goloopPeer is a yardstick, not a production proxy: loops threads of a
// bare Go epoll loop (goloop.go) that pass plain requests on with
// X-Forwarded-For added and nothing else (no header policy, timeouts,
// retries or limits). It shows what a Go data path can reach on this
// machine with that many threads of its own, free of the Go scheduler: the
// sidecar runs one P, and its distance to goloop-1 is what its per-request
// work and goroutines cost, where its distance to goloop-2 is what the
// thread model costs (issue 16, docs/design-notes.md). It runs as a child
// of the benchmark itself, so there is nothing to install.
func goloopPeer(loops int) peerKind {
	return peerKind{
		Name:       "goloop-" + strconv.Itoa(loops),
		Builtin:    true,
		ConfigFile: "goloop.json",
		Config: func(_, listen, upstream string) string {
			b, _ := json.Marshal(goloopConfig{Listen: listen, Upstream: upstream, Loops: loops})
			return string(b)
		},
		Env: func(path string) map[string]string {
			// One P a loop: the loops block in epoll_wait, in system
			// calls, and need a P only while they work.
			return map[string]string{envGoloopChild: path, "GOMAXPROCS": strconv.Itoa(loops)}
		},
	}
}

// envGoloopChild, set to a goloopConfig file, makes the benchmark's own
// executable serve the reference loop instead of running a mode.
const envGoloopChild = "LOADBENCH_GOLOOP_CHILD"

type goloopConfig struct {
	Listen   string `json:"listen"`
	Upstream string `json:"upstream"`
	Loops    int    `json:"loops"`
}

// runGoloopChild serves the loops the file at path describes until SIGTERM
// or an interrupt.
func runGoloopChild(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var cfg goloopConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if cfg.Loops < 1 {
		return fmt.Errorf("%s: loops %d, want at least 1", path, cfg.Loops)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	stop, err := startGoloops(cfg.Listen, cfg.Upstream, cfg.Loops)
	if err != nil {
		return err
	}
	<-sig
	stop()
	return nil
}
