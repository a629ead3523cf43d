package certs

import (
	"fmt"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// Selection follows the sources' precedence (files, then Consul), an
// exact name before a wildcard one label up, and between certificates of
// one source for one name the one valid at the clock's now that expires
// last: no sleeps, the clock moves.
func TestSelectionByPrecedenceNameAndClock(t *testing.T) {
	ca := newTestCA(t, "Test CA")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	dir := t.TempDir()
	// The files: a wildcard for the apps domain, and a certificate for one
	// name that Consul also has.
	wc, wk := ca.sign(t, []string{"*.apps.example.com"}, t0.Add(-time.Hour), t0.Add(90*24*time.Hour), nil)
	fc, fk := ca.sign(t, []string{"both.example.com"}, t0.Add(-time.Hour), t0.Add(90*24*time.Hour), nil)
	m, err := New(Config{
		Files: []FilePair{writePair(t, dir, "wildcard", wc, wk), writePair(t, dir, "both", fc, fk)},
		Now:   func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	// Consul: "both" (loses to the file), a name of its own in two
	// certificates (the current one, and the next one, valid from day 30),
	// an expired one, and a value that is no certificate.
	bc, bk := ca.sign(t, []string{"both.example.com"}, t0.Add(-time.Hour), t0.Add(90*24*time.Hour), nil)
	cur, curK := ca.sign(t, []string{"shop.example.com", "www.shop.example.com"}, t0.Add(-time.Hour), t0.Add(40*24*time.Hour), nil)
	next, nextK := ca.sign(t, []string{"shop.example.com"}, t0.Add(30*24*time.Hour), t0.Add(120*24*time.Hour), nil)
	old, oldK := ca.sign(t, []string{"old.example.com"}, t0.Add(-100*24*time.Hour), t0.Add(-time.Hour), nil)
	m.setSecrets([]consulroute.KVEntry{
		{Key: consulroute.TLSSecretsPrefix + "both", Value: append(bk, bc...)}, // key first: any order
		{Key: consulroute.TLSSecretsPrefix + "shop", Value: append(cur, curK...)},
		{Key: consulroute.TLSSecretsPrefix + "shop-next", Value: append(next, nextK...)},
		{Key: consulroute.TLSSecretsPrefix + "old", Value: append(old, oldK...)},
		{Key: consulroute.TLSSecretsPrefix + "junk", Value: []byte("not a certificate")},
	})
	leaf := func(name string) string {
		t.Helper()
		c, err := m.GetCertificate(hello(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		l := leafOf(t, c)
		if l == nil {
			return "none"
		}
		return fmt.Sprintf("%s/%s", l.DNSNames[0], l.NotAfter.Sub(t0).Round(time.Hour))
	}
	for _, c := range []struct{ name, want string }{
		{"a.apps.example.com", "*.apps.example.com/2160h0m0s"},
		{"A.Apps.Example.Com.", "*.apps.example.com/2160h0m0s"}, // case and a trailing dot
		{"a.b.apps.example.com", "none"},                        // a wildcard covers one label
		{"apps.example.com", "none"},
		{"both.example.com", "both.example.com/2160h0m0s"},
		{"shop.example.com", "shop.example.com/960h0m0s"}, // the next is not valid yet
		{"www.shop.example.com", "shop.example.com/960h0m0s"},
		{"old.example.com", "old.example.com/-1h0m0s"}, // expired, still the only one
		{"nobody.example.com", "none"},
	} {
		if got := leaf(c.name); got != c.want {
			t.Errorf("%s: served %s, want %s", c.name, got, c.want)
		}
	}
	// "both" comes from the file, not from Consul.
	if c, _ := m.GetCertificate(hello("both.example.com")); leafOf(t, c).SerialNumber.Cmp(leafOf(t, m.files.Load().lookup("both.example.com", now).tls).SerialNumber) != 0 {
		t.Error("both.example.com is served from Consul, not from the file that comes first")
	}
	// Day 35: the next certificate is valid and expires last.
	now = t0.Add(35 * 24 * time.Hour)
	if got := leaf("shop.example.com"); got != "shop.example.com/2880h0m0s" {
		t.Errorf("day 35: shop.example.com served %s, want the next certificate", got)
	}
	if got := leaf("www.shop.example.com"); got != "shop.example.com/960h0m0s" {
		t.Errorf("day 35: www.shop.example.com served %s (only the first covers it)", got)
	}
	// No server name: the first file's certificate.
	if got := leaf(""); got != "*.apps.example.com/2160h0m0s" {
		t.Errorf("no server name: %s, want the first file's", got)
	}
	// HasCertificate is "valid now".
	for name, want := range map[string]bool{"x.apps.example.com": true, "old.example.com": false, "nobody.example.com": false} {
		if got := m.HasCertificate(name); got != want {
			t.Errorf("HasCertificate(%s) = %v, want %v", name, got, want)
		}
	}
	if n := len(m.secretErrs); n != 1 {
		t.Errorf("%d values remembered as not loading, want 1 (junk)", n)
	}
}

// Without any certificate a handshake gets (nil, nil): crypto/tls then
// answers unrecognized_name at once rather than wait or show another
// name's certificate.
func TestNoCertificateIsRefusedAtOnce(t *testing.T) {
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "a.example.com"} {
		if c, err := m.GetCertificate(hello(name)); c != nil || err != nil {
			t.Errorf("%q: %v, %v; want nil, nil", name, c, err)
		}
	}
	if got := m.TLSConfig(); got.MinVersion != 0x0303 || got.NextProtos[0] != "h2" || got.NextProtos[1] != "http/1.1" || got.SessionTicketsDisabled {
		t.Errorf("TLS config: min %x, ALPN %v, tickets off %v", got.MinVersion, got.NextProtos, got.SessionTicketsDisabled)
	}
}

// Files that do not load stop New; a file that changes is read again, and
// one that changes into something broken keeps the last good certificate.
func TestFilesLoadAndReload(t *testing.T) {
	ca := newTestCA(t, "Test CA")
	dir := t.TempDir()
	if _, err := New(Config{Files: []FilePair{{Cert: dir + "/none.crt", Key: dir + "/none.key"}}}); err == nil {
		t.Fatal("missing files accepted")
	}
	c1, k1 := ca.sign(t, []string{"a.example.com"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), nil)
	p := writePair(t, dir, "a", c1, k1)
	m, err := New(Config{Files: []FilePair{p}})
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		c, _ := m.GetCertificate(hello("a.example.com"))
		return leafOf(t, c).SerialNumber.Int64()
	}
	first := serial()
	c2, k2 := ca.sign(t, []string{"a.example.com"}, time.Now().Add(-time.Hour), time.Now().Add(2*time.Hour), nil)
	writePair(t, dir, "a", append(c2, '\n'), k2) // a different size, whatever the clock's resolution
	m.reloadFiles()
	if serial() == first {
		t.Fatal("a renewed file was not read again")
	}
	second := serial()
	writePair(t, dir, "a", []byte("garbage"), k2)
	m.reloadFiles()
	if serial() != second {
		t.Error("a broken file replaced the certificate served")
	}
}
