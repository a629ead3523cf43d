package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The HTTPS port end to end on the fake cluster: serve takes a wildcard
// certificate an operator put in Consul KV, a service is served over h2
// and HTTP/1.1 with it, its plain HTTP is redirected because its file
// says so, and status shows the certificate. (ACME against a real CA is
// e2e scenario 24.)
func TestIntegrationHTTPS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs serve and real app processes on the fake cluster; skipped with -short")
	}
	it := newInteg(t)
	bundle, pool := wildcardBundle(t, "*.default.localhost")
	cc, err := consulroute.NewClient(func() *consulapi.Config {
		cfg := consulapi.DefaultConfig()
		cfg.Address = it.cluster.Consul.Addr()
		return cfg
	}())
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.KVPut(context.Background(), consulroute.TLSSecretsPrefix+"wildcard.default.localhost", bundle); err != nil {
		t.Fatal(err)
	}
	s, httpsAddr := it.startHTTPSServe("replica-a")
	file := strings.Replace(it.helloService("secure"), `service "hello" {`, `service "hello" {
  https {
    redirect = true
  }`, 1)
	if r := it.deploy(it.writeFile("hello.hcl", file)); r.code != 0 {
		t.Fatalf("%s", r)
	}
	host := "hello.default." + activator.DefaultDomain
	for _, h2 := range []bool{true, false} {
		var p http.Protocols
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			Protocols:       &p,
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", httpsAddr)
			},
		}}
		var resp *http.Response
		eventually(t, 30*time.Second, fmt.Sprintf("an HTTPS answer (h2 %v)", h2), func() (bool, string) {
			r, err := c.Get("https://" + host + "/")
			if err != nil {
				return false, err.Error()
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			resp = r
			return r.StatusCode == 200, r.Status
		})
		if resp.Header.Get("X-Testapp-Name") != "secure" || (resp.ProtoMajor == 2) != h2 {
			t.Errorf("h2 %v: answered by %q over %s", h2, resp.Header.Get("X-Testapp-Name"), resp.Proto)
		}
	}
	// Plain HTTP: 308 to the HTTPS port.
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.listen+"/p?q=1", nil)
	req.Host = host
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, port, _ := net.SplitHostPort(httpsAddr)
	if want := "https://" + host + ":" + port + "/p?q=1"; resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
		t.Errorf("plain HTTP: %d to %q, want 308 to %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	// status shows the certificate, and the https URL.
	var st struct {
		rollout.ServiceView
	}
	it.cliJSON(&st, "status", "-json", "hello")
	if len(st.Certificates) == 0 {
		t.Fatalf("status shows no certificate: %+v", st.ServiceView)
	}
	c := st.Certificates[0]
	if c.Name != host || c.Source != certs.SourceConsul || c.State != "valid" || c.Issuer != "Integration CA" {
		t.Errorf("status certificate: %+v", c)
	}
	if len(st.URLs) == 0 || st.URLs[0] != "https://"+host+"/" {
		t.Errorf("status URLs %v, want the https URL first", st.URLs)
	}
	if r := it.mustCLI("status", "hello"); !strings.Contains(r.stdout, "consul, valid") || !strings.Contains(r.stdout, "Integration CA") {
		t.Errorf("status's text lacks the certificate:\n%s", r.stdout)
	}
}

// startHTTPSServe starts serve with an HTTPS port (certificates from
// Consul KV) and returns it and the HTTPS address.
func (it *integ) startHTTPSServe(replica string) (*serveProc, string) {
	it.t.Helper()
	gw, admin, https := testbin.FreePort(it.t), testbin.FreePort(it.t), testbin.FreePort(it.t)
	s := &serveProc{replica: replica, listen: "127.0.0.1:" + strconv.Itoa(gw), admin: "127.0.0.1:" + strconv.Itoa(admin)}
	env := map[string]string{}
	for k, v := range it.cluster.Env() {
		env[k] = v
	}
	for _, k := range []string{"NOMAD_TOKEN", "NOMAD_NAMESPACE", "CONSUL_HTTP_TOKEN", "NOMAD_REGION"} {
		env[k] = ""
	}
	s.proc = testbin.Start(it.root, it.bin, []string{"serve", "-listen", s.listen, "-admin-listen", s.admin,
		"-https-port", strconv.Itoa(https), "-replica", replica, "-tick", "250ms"}, env)
	it.serves = append(it.serves, s)
	eventually(it.t, 20*time.Second, "serve "+replica+" answers "+activator.HealthPath, func() (bool, string) {
		select {
		case <-s.proc.Done():
			it.t.Fatalf("serve %s exited:\n%s", replica, s.proc.Output())
		default:
		}
		code, _, err := httpGet("http://"+s.admin+activator.HealthPath, "", nil)
		return err == nil && code == http.StatusOK, fmt.Sprintf("code %d err %v", code, err)
	})
	return s, "127.0.0.1:" + strconv.Itoa(https)
}

// wildcardBundle is a certificate for name signed by a CA of the test, as
// an operator puts it in KV (chain, then key), and a pool trusting it.
func wildcardBundle(t *testing.T, name string) ([]byte, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Integration CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	bundle := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return bundle, pool
}
