package certs

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// ACME orders nothing for an internal service's names; turned public, the
// name is ordered like any other, and turned internal again its
// certificate is no longer served (a handshake for it is refused as for a
// name nobody routes).
func TestNoACMEOrderForInternalNames(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	iss := &countingIssuer{t: t, ca: newTestCA(t, "Test ACME CA"), validity: 90 * 24 * time.Hour}
	r := startReplica(t, c, "r1", iss, time.Hour)
	public := Name{Host: "a.example.com", Service: "a", Namespace: "default"}
	secret := Name{Host: "billing.example.com", Service: "billing", Namespace: "default", Internal: true}
	r.m.SetNames([]Name{public, secret})
	eventually(t, 20*time.Second, "a.example.com served", func() bool { return r.serial(t, public.Host) != "" })
	if n := iss.ordersOf(secret.Host); n != 0 {
		t.Fatalf("the internal name was ordered %d times", n)
	}
	if r.serial(t, secret.Host) != "" {
		t.Fatal("a certificate is served for the internal name")
	}
	for _, s := range r.m.Status() {
		if s.Name == secret.Host && (s.State != "none" || !strings.Contains(s.Note, "internal service")) {
			t.Errorf("status of the internal name: %+v", s)
		}
	}

	secret.Internal = false
	r.m.SetNames([]Name{public, secret})
	eventually(t, 20*time.Second, "billing.example.com served once public", func() bool { return r.serial(t, secret.Host) != "" })
	if n := iss.ordersOf(secret.Host); n != 1 {
		t.Errorf("the name turned public was ordered %d times, want 1", n)
	}

	secret.Internal = true
	r.m.SetNames([]Name{public, secret})
	if r.serial(t, secret.Host) != "" {
		t.Error("the name turned internal again still has its ACME certificate served")
	}
}
