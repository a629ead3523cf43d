package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/test/testcert"
)

// internalDomain is the zone of the internal service's extra domain in
// scenario 28 (the gateway's file certificate covers *.internalDomain).
const internalDomain = "e2e28.test"

// Scenario 28: a private service (visibility = "internal", Knative's
// cluster-local). On the gateway's public HTTP and HTTPS ports its name,
// its tag's name and its domain get exactly the answer a name nobody
// routes gets (404, same headers, same words; no redirect to HTTPS
// although it asks for one and has a certificate), its revision named by
// X-Serverless-Revision too; on the internal listener (serve
// -internal-listen) it answers, waking from zero; a public service calls
// it through the internal listener. Consul lists the internal listener,
// the internal revision fails over to it in the mesh, status and list say
// internal, and turning the service public and back changes only its
// route. An unknown visibility deploys nothing and says where and why.
func TestE2E28InternalService(t *testing.T) {
	h := newHarness(t, "28 internal service")
	const svc, caller = "e2e-internal", "e2e-caller"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	h.cleanupService(caller)

	// A file certificate for every name the scenario asks over HTTPS,
	// known or not: the handshake succeeds alike, and what follows is
	// the gateway's answer.
	certFile, keyFile := writeCertificate(t, h.dir, "*.default.localhost", "*."+internalDomain)
	internalAddr := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	httpsPort := testbin.FreePort(t)
	g := h.startServeArgs("e2e-28", "", "", "-internal-listen", internalAddr,
		"-https-port", strconv.Itoa(httpsPort), "-tls-cert", certFile, "-tls-key", keyFile)
	httpsAddr := "127.0.0.1:" + strconv.Itoa(httpsPort)

	_, internalPort, _ := strings.Cut(internalAddr, ":")
	eventually(t, 30*time.Second, "Consul lists the internal listener as a passing "+spec.InternalServiceName, func() (bool, string) {
		entries, _, err := h.consul.Health().Service(spec.InternalServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range entries {
			seen = append(seen, fmt.Sprintf("%s:%d", e.Service.Address, e.Service.Port))
			if strconv.Itoa(e.Service.Port) == internalPort {
				return true, ""
			}
		}
		return false, fmt.Sprintf("passing instances %v", seen)
	})

	// Bad input: an unknown visibility is one located diagnostic that
	// says how to fix it, and nothing is deployed.
	bad := testService("e2e-badvis")
	bad.Visibility = "private"
	badFile := h.writeServices("bad.hcl", bad)
	if _, errOut, code := h.cli("deploy", "-sidecar-command", h.bin, badFile); code != 1 ||
		!strings.Contains(errOut, "on "+badFile+" line ") || !strings.Contains(errOut, `visibility "private" is not one the gateway knows`) ||
		!strings.Contains(errOut, `Use "public"`) || !strings.Contains(errOut, "Nothing was deployed") {
		t.Errorf("deploy of an unknown visibility: exit %d, want 1 with a located diagnostic:\n%s", code, errOut)
	}
	if jobs, _, err := h.nomad.Jobs().PrefixList("e2e-badvis-"); err != nil || len(jobs) != 0 {
		t.Errorf("an unknown visibility registered %d jobs (%v)", len(jobs), err)
	}

	internal := testService(svc)
	internal.Env = map[string]string{"TESTAPP_NAME": "internal-v1"}
	internal.Visibility = string(spec.VisibilityInternal)
	internal.Traffic = []Traffic{{Latest: true, Percent: 100, Tag: "cur"}}
	internal.Domains = []string{"billing." + internalDomain}
	// Its names have a certificate: were they known on the public port,
	// plain HTTP would answer 308.
	internal.HTTPSRedirect = true
	public := testService(caller)
	public.Env = map[string]string{"TESTAPP_NAME": "caller"}
	file := h.writeServices("internal.hcl", internal, public)
	out := h.deploy(file)
	if u := out.URLs[svc]; u.Gateway != internalAddr {
		t.Errorf("deploy sends the internal service's curl to %q, want the internal listener %s:\n%s", u.Gateway, internalAddr, out.Text)
	}
	if u := out.URLs[caller]; u.Gateway != g.listen {
		t.Errorf("deploy sends the public service's curl to %q, want the gateway %s", u.Gateway, g.listen)
	}

	// The mesh: the internal revision fails over to the internal
	// listeners, the public one to the activator as before.
	if got := h.chain(svc).Failover[rev]; !slices.Equal(got, []string{spec.InternalServiceName}) {
		t.Errorf("Consul fails %s over to %v, want %s", rev, got, spec.InternalServiceName)
	}
	if got := h.chain(caller).Failover[revision(caller, 1)]; !slices.Equal(got, []string{spec.ActivatorServiceName}) {
		t.Errorf("Consul fails the public revision over to %v, want %s", got, spec.ActivatorServiceName)
	}

	// The public ports: each name of the internal service is answered as
	// the same name of a service that does not exist.
	plain, secure := NewClient(2), httpsClient(httpsAddr, certFile)
	nobodyRev := revision("e2e-nosuch", 1)
	pairs := [][2]string{
		{host(svc, ""), "e2e-nosuch.default.localhost"},
		{host(svc, "cur"), "cur-e2e-nosuch.default.localhost"},
		{"billing." + internalDomain, "nosuch." + internalDomain},
	}
	var asked []string
	for _, p := range pairs {
		for _, how := range []string{"", " https"} {
			asked = append(asked, p[0]+how)
			hidden := publicAnswer(t, g.url(), plain, secure, p[0]+how)
			nobody := publicAnswer(t, g.url(), plain, secure, p[1]+how)
			if hidden.status != http.StatusNotFound || hidden.normal(p[0], rev) != nobody.normal(p[1], nobodyRev) {
				t.Errorf("public port, %s%s: the internal service shows:\n internal: %s\n nobody's: %s", p[0], how, hidden, nobody)
			}
		}
	}
	hidden := publicAnswer(t, g.url(), plain, secure, "10.9.9.9 "+rev)
	nobody := publicAnswer(t, g.url(), plain, secure, "10.9.9.9 "+nobodyRev)
	if hidden.status != http.StatusNotFound || hidden.normal("10.9.9.9", rev) != nobody.normal("10.9.9.9", nobodyRev) {
		t.Errorf("public port, %s named by %s: the internal service shows:\n internal: %s\n nobody's: %s", rev, spec.RevisionHeader, hidden, nobody)
	}
	t.Logf("public HTTP and HTTPS answer %s like names nobody routes (404), and %s named by %s", strings.Join(asked, ", "), rev, spec.RevisionHeader)

	// The internal listener: the revision is at zero; a request wakes it.
	took := h.waitZero(rev, 90*time.Second)
	h.timing("deploy idle -> zero (window 6s, grace 2s)", took)
	client := NewClient(4)
	woke := Request{Client: client, URL: "http://" + internalAddr + "/", Host: host(svc, ""), Timeout: 60 * time.Second}.Do(context.Background())
	if !woke.OK() || woke.App != "internal-v1" {
		t.Fatalf("internal listener, request at zero: %s (app %q)", woke.Describe(), woke.App)
	}
	h.timing("internal listener: request at zero -> first byte", woke.FirstByte.Sub(woke.Start))
	for _, n := range []string{host(svc, "cur"), "billing." + internalDomain} {
		o := Request{Client: client, URL: "http://" + internalAddr + "/", Host: n, Timeout: 60 * time.Second}.Do(context.Background())
		if !o.OK() || o.App != "internal-v1" {
			t.Errorf("internal listener, Host %s: %s (app %q)", n, o.Describe(), o.App)
		}
	}

	// status: the URLs, said internal, with the internal listener, and
	// the wake the internal listener held.
	var st struct {
		URLs   []string `json:"urls"`
		Served struct {
			Internal bool   `json:"internal"`
			Listener string `json:"listener"`
		} `json:"served"`
		LastWake *spec.WakeTimeline `json:"last_wake"`
	}
	eventually(t, 30*time.Second, "status shows "+svc+" internal and its wake", func() (bool, string) {
		outJSON, errOut, code := h.cli("status", "-json", svc)
		if code != 0 {
			return false, errOut
		}
		if err := json.Unmarshal([]byte(outJSON), &st); err != nil {
			return false, err.Error()
		}
		return st.LastWake != nil && st.LastWake.Revision == rev && !st.LastWake.Held().Before(woke.Start), fmt.Sprintf("status %+v", st)
	})
	wantURLs := []string{"http://" + host(svc, "") + "/", "http://billing." + internalDomain + "/", "http://" + host(svc, "cur") + "/"}
	if !st.Served.Internal || st.Served.Listener != internalAddr || !slices.Equal(st.URLs, wantURLs) {
		t.Errorf("status -json: served %+v, urls %v; want internal on %s, urls %v", st.Served, st.URLs, internalAddr, wantURLs)
	}
	if text := h.mustCLI("status", svc); !strings.Contains(text, "internal, on the gateways' internal listener ("+internalAddr+")") {
		t.Errorf("status does not say the service is internal:\n%s", text)
	}
	var rows []struct {
		Service  string `json:"service"`
		Internal bool   `json:"internal"`
	}
	if err := json.Unmarshal([]byte(h.mustCLI("list", "-json")), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if (r.Service == svc) != r.Internal && (r.Service == svc || r.Service == caller) {
			t.Errorf("list: %s internal=%v", r.Service, r.Internal)
		}
	}

	// A public service calls the internal one through the internal
	// listener; through the public port it finds nothing.
	fetch := func(via string) answer {
		q := url.Values{"url": {"http://" + via + "/"}, "host": {host(svc, "")}}
		return getAnswer(t, plain, g.url()+"/fetch?"+q.Encode(), host(caller, ""), nil)
	}
	if a := fetch(internalAddr); a.status != http.StatusOK || a.header.Get("X-Testapp-Fetched-Name") != "internal-v1" || a.header.Get("X-Testapp-Name") != "caller" {
		t.Errorf("the public service calling the internal one on the internal listener: %s", a)
	}
	if a := fetch(g.listen); a.status != http.StatusNotFound {
		t.Errorf("the public service calling the internal one on the public port: %s, want 404", a)
	}

	// Visibility is a route setting: public and back, no new revision.
	for _, vis := range []string{"", string(spec.VisibilityInternal)} {
		internal.Visibility = vis
		out := h.deploy(h.writeServices("internal.hcl", internal, public))
		if len(out.Registered) != 0 || !slices.Contains(out.Unchanged, rev) {
			t.Errorf("visibility %q: deploy made a revision (registered %v, unchanged %v)", vis, out.Registered, out.Unchanged)
		}
		want := http.StatusOK
		if vis != "" {
			want = http.StatusNotFound
		}
		eventually(t, 30*time.Second, fmt.Sprintf("the HTTPS port answers %s with %d", host(svc, ""), want), func() (bool, string) {
			a := publicAnswer(t, g.url(), plain, secure, host(svc, "")+" https")
			return a.status == want, a.String()
		})
	}
}

// answer is a response as a client saw it, without its Date.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) String() string { return fmt.Sprintf("%d %v %q", a.status, a.header, a.body) }

// normal is the answer with its host and revision name replaced by
// placeholders and its length left out, to compare the answers two names
// got.
func (a answer) normal(host, rev string) string {
	h := a.header.Clone()
	h.Del("Content-Length")
	body := strings.ReplaceAll(strings.ReplaceAll(a.body, host, "HOST"), rev, "REVISION")
	return fmt.Sprintf("%d %v %q", a.status, h, body)
}

// getAnswer GETs url with Host host (and headers hdr).
func getAnswer(t *testing.T, c *http.Client, u, host string, hdr map[string]string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", u, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// publicAnswer asks the gateway's public ports about name: "HOST" on the
// plain port, "HOST https" on the HTTPS port (its name as SNI), "IP
// REVISION" on the plain port with the revision in X-Serverless-Revision.
func publicAnswer(t *testing.T, gatewayURL string, plain, secure *http.Client, name string) answer {
	t.Helper()
	host, extra, _ := strings.Cut(name, " ")
	switch {
	case extra == "https":
		return getAnswer(t, secure, "https://"+host+"/", host, nil)
	case extra != "":
		return getAnswer(t, plain, gatewayURL+"/", host, map[string]string{spec.RevisionHeader: extra})
	}
	return getAnswer(t, plain, gatewayURL+"/", host, nil)
}

// httpsClient speaks HTTPS to addr whatever the URL's host (sent as SNI),
// trusting the certificate in certFile; it follows no redirects.
func httpsClient(addr, certFile string) *http.Client {
	pool := x509.NewCertPool()
	if b, err := os.ReadFile(certFile); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	return &http.Client{
		Timeout:       60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			Proxy:           nil,
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
			},
		},
	}
}

// writeCertificate writes a self-signed certificate for names and its key
// as PEM files in dir, for serve's -tls-cert and -tls-key.
func writeCertificate(t *testing.T, dir string, names ...string) (certFile, keyFile string) {
	t.Helper()
	cert, _ := testcert.SelfSigned(t, names...)
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key")
	for path, block := range map[string]*pem.Block{
		certFile: {Type: "CERTIFICATE", Bytes: cert.Certificate[0]},
		keyFile:  {Type: "PRIVATE KEY", Bytes: key},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}
