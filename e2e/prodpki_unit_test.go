package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUnitCAMutualTLS checks that what NewCA and Issue make works for
// mutual TLS the way the agents use it: the server's certificate verifies
// for its SANs against the CA, a client with a certificate from the CA gets
// in, and a client trusting another CA is refused with an unknown-authority
// error (the "wrong CA" the scenario makes on purpose).
func TestUnitCAMutualTLS(t *testing.T) {
	ca, err := NewCA("e2e test CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	srvLeaf, err := ca.Issue("server.global.nomad", []string{"server.global.nomad", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cliLeaf, err := ca.Issue("deploy user", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	srvCert, err := tls.X509KeyPair(srvLeaf.CertPEM, srvLeaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	ts.StartTLS()
	defer ts.Close()

	cliCert, err := tls.X509KeyPair(cliLeaf.CertPEM, cliLeaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	get := func(roots *x509.CertPool) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cliCert}}}}
		resp, err := c.Get(ts.URL)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := get(pool); err != nil {
		t.Fatalf("mutual TLS with the CA: %v", err)
	}
	otherPool := x509.NewCertPool()
	otherPool.AppendCertsFromPEM(other.CertPEM)
	if err := get(otherPool); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("trusting another CA: error %v, want unknown authority", err)
	}
	k, err := GossipKey()
	if err != nil {
		t.Fatal(err)
	}
	if b, err := base64.StdEncoding.DecodeString(k); err != nil || len(b) != 32 {
		t.Fatalf("gossip key %q: %d bytes, %v; want 32", k, len(b), err)
	}
}
