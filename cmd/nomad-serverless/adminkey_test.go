package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/adminauth"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// `admin-key rotate` adds a key the running replicas pick up, accepted at
// once and signing after the grace.
func TestAdminKeyRotateCommand(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	consul, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	// A running replica's keyring: read from Consul, then followed, as
	// serve does (package controlplane).
	kr, _, err := consul.AdminKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ring := &adminauth.Ring{}
	ring.Set(kr)
	go func() { _ = consul.WatchAdminKeys(ctx, ring.Set) }()
	before := ring.Keyring().Signing(time.Now()).ID

	if code, _, stderr := runInProcess(t, c, "admin-key", "rotate", "-grace", "-1s"); code != exitUsage || !strings.Contains(stderr, "negative") {
		t.Fatalf("rotate -grace -1s: exit %d %s", code, stderr)
	}
	if code, _, _ := runInProcess(t, c, "admin-key"); code != exitUsage {
		t.Fatalf("admin-key without rotate: exit %d, want usage", code)
	}
	code, stdout, stderr := runInProcess(t, c, "admin-key", "rotate", "-grace", "1h")
	if code != exitOK || !strings.Contains(stdout, "New admin API key") {
		t.Fatalf("rotate: exit %d\n%s%s", code, stdout, stderr)
	}
	eventually(t, 5*time.Second, "the running replica reads the rotated keyring", func() (bool, string) {
		n := len(ring.Keyring().Keys())
		return n == 2, fmt.Sprintf("%d keys", n)
	})
	if now := ring.Keyring().Signing(time.Now()).ID; now != before {
		t.Fatalf("signing with %s within the grace, want the old key %s", now, before)
	}
}
