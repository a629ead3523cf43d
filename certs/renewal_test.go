package certs

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// Renewal is due at a third of the validity left, sooner at the ARI
// moment, and at the emergency point for certificates that live only a
// few check intervals: judged against a clock.
func TestRenewalTiming(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	r := Renewal{NotBefore: t0, NotAfter: t0.Add(90*day - time.Second), CheckInterval: 10 * time.Minute}
	if got, want := r.At(), t0.Add(60*day); !got.Equal(want) {
		t.Errorf("90-day certificate renews at %s, want day 60 (%s)", got, want)
	}
	for _, c := range []struct {
		at  time.Duration
		due bool
	}{{0, false}, {59 * day, false}, {60*day - time.Second, false}, {60*day + time.Second, true}, {89 * day, true}, {100 * day, true}} {
		if got := r.Due(t0.Add(c.at)); got != c.due {
			t.Errorf("day %.2f: due %v, want %v", c.at.Hours()/24, got, c.due)
		}
	}
	// ARI picked day 50: one check interval before it.
	ari := r
	ari.ARISelected = t0.Add(50 * day)
	if got, want := ari.At(), t0.Add(50*day-10*time.Minute); !got.Equal(want) {
		t.Errorf("with ARI at day 50: %s, want %s", got, want)
	}
	// A late ARI moment does not push renewal past a third left.
	ari.ARISelected = t0.Add(85 * day)
	if got := ari.At(); !got.Equal(t0.Add(60 * day)) {
		t.Errorf("with ARI at day 85: %s, want day 60", got)
	}
	// A 2-minute certificate checked every 10 s: five checks before expiry
	// (50 s) comes before a third (40 s).
	short := Renewal{NotBefore: t0, NotAfter: t0.Add(2*time.Minute - time.Second), CheckInterval: 10 * time.Second}
	if got, want := short.At(), t0.Add(70*time.Second); !got.Equal(want) {
		t.Errorf("2-minute certificate: %s, want %s", got, want)
	}
	// The default check interval applies when none is given.
	if got, want := (Renewal{NotBefore: t0, NotAfter: t0.Add(time.Hour - time.Second)}).At(), t0.Add(10*time.Minute); !got.Equal(want) {
		t.Errorf("1-hour certificate, default interval: %s, want %s (five 10-minute checks before expiry)", got, want)
	}
}

// certmagic, configured as the Manager configures it, renews when Renewal
// says: checked on certificates placed around the present, far enough
// from the boundary that the test's own time does not matter.
func TestRenewalMatchesCertmagic(t *testing.T) {
	ca := newTestCA(t, "Test CA")
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return nil, nil },
		RenewCheckInterval: time.Minute,
		Logger:             zap.NewNop(),
	})
	defer cache.Stop()
	cfg := certmagic.New(cache, certmagic.Config{RenewalWindowRatio: RenewalWindowRatio, Issuers: []certmagic.Issuer{}, Logger: zap.NewNop()})
	now := time.Now()
	day := 24 * time.Hour
	for _, c := range []struct {
		name          string
		age, lifetime time.Duration
	}{
		{"fresh 90-day", day, 90 * day},
		{"59 days into 90", 59 * day, 90 * day},
		{"61 days into 90", 61 * day, 90 * day},
		{"4 of 6 days", 4*day - time.Hour, 6 * day},
		{"4 of 6 days, past", 4*day + time.Hour, 6 * day},
		{"10 minutes of an hour", 10 * time.Minute, time.Hour},
		{"50 minutes of an hour", 50 * time.Minute, time.Hour},
		{"expired", 91 * day, 90 * day},
	} {
		nb := now.Add(-c.age).Truncate(time.Second)
		na := nb.Add(c.lifetime - time.Second)
		chain, key := ca.sign(t, []string{"a.example.com"}, nb, na, nil)
		tc, err := tls.X509KeyPair(chain, key)
		if err != nil {
			t.Fatal(err)
		}
		cm := certmagic.Certificate{Certificate: tc}
		want := Renewal{NotBefore: tc.Leaf.NotBefore, NotAfter: tc.Leaf.NotAfter, CheckInterval: time.Minute}.Due(now)
		if got := cm.NeedsRenewal(cfg); got != want {
			t.Errorf("%s: certmagic renews %v, Renewal says %v", c.name, got, want)
		}
	}
}
