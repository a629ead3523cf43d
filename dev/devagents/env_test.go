package devagents

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestFillFree(t *testing.T) {
	p, err := Ports{ConsulHTTP: 8500, NomadHTTP: 4646}.FillFree()
	if err != nil {
		t.Fatal(err)
	}
	if p.ConsulHTTP != 8500 || p.NomadHTTP != 4646 {
		t.Errorf("given ports changed: %+v", p)
	}
	seen := map[int]bool{}
	for _, port := range p.fields() {
		if *port <= 0 || seen[*port] {
			t.Fatalf("ports %+v: %d repeated or invalid", p, *port)
		}
		seen[*port] = true
	}
}

func TestPortFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	err = PortFree(port, "Consul HTTP")
	if err == nil || !strings.Contains(err.Error(), "port "+strconv.Itoa(port)+" (Consul HTTP) is in use") {
		t.Errorf("busy port: %v", err)
	}
	ln.Close()
	if err := PortFree(port, "Consul HTTP"); err != nil {
		t.Errorf("free port: %v", err)
	}
}

func TestLookPath(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(a, "nomad"), []byte("not executable"), 0o644)
	os.Mkdir(filepath.Join(a, "consul"), 0o755)
	os.WriteFile(filepath.Join(b, "nomad"), []byte("#!/bin/sh\n"), 0o755)
	path := a + string(os.PathListSeparator) + b
	if p, ok := LookPath("nomad", path); !ok || p != filepath.Join(b, "nomad") {
		t.Errorf("nomad: %q %v, want the executable in the second directory", p, ok)
	}
	if p, ok := LookPath("consul", path); ok {
		t.Errorf("consul: found directory %q", p)
	}
}

func TestChildEnv(t *testing.T) {
	env := ChildEnv([]string{"PATH=/bin", "NOMAD_TOKEN=x", "CONSUL_HTTP_TOKEN=y", "NOMAD_NAMESPACE=prod", "HOME=/h", "NOMAD_SERVERLESS_TEST_BIN=/b"})
	if !slices.Equal(env, []string{"PATH=/bin", "HOME=/h", "NOMAD_SERVERLESS_TEST_BIN=/b"}) {
		t.Errorf("child env = %v", env)
	}
	if got := InstallURL("nomad"); got != "https://developer.hashicorp.com/nomad/install" {
		t.Errorf("InstallURL = %q", got)
	}
}
