package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// testCA signs certificates in tests.
type testCA struct {
	name string
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	pool *x509.CertPool
	mu   sync.Mutex
	next int64
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-24 * time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return &testCA{name: name, key: key, cert: c, pool: pool, next: 1}
}

// sign makes a leaf for names, valid from notBefore to notAfter, for pub
// (a new key when nil, returned PEM-encoded).
func (ca *testCA) sign(t testing.TB, names []string, notBefore, notAfter time.Time, pub crypto.PublicKey) (chainPEM, keyPEM []byte) {
	t.Helper()
	if pub == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pub = &key.PublicKey
		der, _ := x509.MarshalECPrivateKey(key)
		keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	ca.mu.Lock()
	ca.next++
	serial := ca.next
	ca.mu.Unlock()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

// writePair writes a certificate and key as files.
func writePair(t testing.TB, dir, name string, chain, key []byte) FilePair {
	t.Helper()
	p := FilePair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(p.Cert, chain, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Key, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// countingIssuer is an ACME CA stand-in for certmagic: it signs every CSR
// with ca for validity, and counts the orders per name.
type countingIssuer struct {
	t        testing.TB
	ca       *testCA
	validity time.Duration
	orders   sync.Map // name -> *atomic.Int64
	fail     atomic.Bool
}

func (i *countingIssuer) IssuerKey() string { return "test-ca" }

func (i *countingIssuer) Issue(_ context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	for _, n := range csr.DNSNames {
		v, _ := i.orders.LoadOrStore(n, &atomic.Int64{})
		v.(*atomic.Int64).Add(1)
	}
	if i.fail.Load() {
		return nil, errTestCADown
	}
	now := time.Now()
	chain, _ := i.ca.sign(i.t, csr.DNSNames, now.Add(-time.Second), now.Add(i.validity), csr.PublicKey)
	return &certmagic.IssuedCertificate{Certificate: chain}, nil
}

func (i *countingIssuer) ordersOf(name string) int64 {
	v, ok := i.orders.Load(name)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errTestCADown = testErr("the test CA is down")

// hello is a ClientHello for name offering protos.
func hello(name string, protos ...string) *tls.ClientHelloInfo {
	if len(protos) == 0 {
		protos = []string{"h2", "http/1.1"}
	}
	return &tls.ClientHelloInfo{ServerName: name, SupportedProtos: protos}
}

// leafOf parses what GetCertificate returned.
func leafOf(t testing.TB, c *tls.Certificate) *x509.Certificate {
	t.Helper()
	if c == nil {
		return nil
	}
	if c.Leaf != nil {
		return c.Leaf
	}
	l, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eventually polls cond every 20ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
