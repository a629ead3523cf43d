package activator

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/testcert"
)

// testTLS stands in for package certs: certificates by name, challenges
// by path.
type testTLS struct {
	mu         sync.Mutex
	certs      map[string]*tls.Certificate
	challenges map[string]string
}

func (f *testTLS) get(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.certs[hello.ServerName], nil // nil: unrecognized_name
}

func (f *testTLS) HasCertificate(host string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.certs[host] != nil
}

func (f *testTLS) ServeChallenge(w http.ResponseWriter, r *http.Request) bool {
	f.mu.Lock()
	body, ok := f.challenges[r.URL.Path]
	f.mu.Unlock()
	if ok {
		io.WriteString(w, body)
	}
	return ok
}

// tlsGateway is a gateway with both ports.
type tlsGateway struct {
	*testGateway
	tlsAddr string
	pool    *x509.CertPool
	certs   *testTLS
}

func startTLSGateway(t *testing.T, cat *catalog.Catalog, as *fakeAutoscaler) *tlsGateway {
	t.Helper()
	names := []string{"hello.default.localhost", "canary-hello.default.localhost", "hello.example.com"}
	cert, pool := testcert.SelfSigned(t, names...)
	ft := &testTLS{certs: map[string]*tls.Certificate{}, challenges: map[string]string{}}
	for _, n := range names {
		ft.certs[n] = &cert
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port := splitHostPort(t, ln.Addr().String())
	tg := startGateway(t, cat, as, func(c *Config) { c.TLS = ft; c.HTTPSPort = port })
	srv := tg.g.TLSServer("")
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1", "acme-tls/1"}, GetCertificate: ft.get}
	go func() { _ = srv.Serve(tg.g.TLSListener(ln, cfg)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return &tlsGateway{testGateway: tg, tlsAddr: ln.Addr().String(), pool: pool, certs: ft}
}

// client speaks HTTPS to the gateway's TLS port whatever the URL's host,
// over h2 or HTTP/1.1.
func (tg *tlsGateway) client(h2 bool) *http.Client {
	var p http.Protocols
	if h2 {
		p.SetHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Protocols:       &p,
		TLSClientConfig: &tls.Config{RootCAs: tg.pool, ClientSessionCache: tls.NewLRUClientSessionCache(8)},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", tg.tlsAddr)
		},
	}}
}

func httpsGet(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// Both protocols over TLS reach the revision as on the plain port, the
// sidecar hears HTTP/2 when the client spoke it, and the app learns the
// request came over HTTPS.
func TestHTTPSRoutesH2AndHTTP1(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	var mu sync.Mutex
	seen := map[string]string{}
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Proto] = r.Header.Get("X-Forwarded-Proto") + " | " + r.Header.Get("Forwarded")
		mu.Unlock()
		io.WriteString(w, "ok from "+r.Host)
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startTLSGateway(t, cat, nil)
	for _, h2 := range []bool{true, false} {
		c := tg.client(h2)
		for _, host := range []string{"hello.default.localhost", "canary-hello.default.localhost", "hello.example.com"} {
			resp, body := httpsGet(t, c, "https://"+host+"/x")
			if resp.StatusCode != 200 || body != "ok from "+host {
				t.Errorf("h2=%v %s: %d %q", h2, host, resp.StatusCode, body)
			}
			if wantMajor := map[bool]int{true: 2, false: 1}[h2]; resp.ProtoMajor != wantMajor {
				t.Errorf("h2=%v: answered over %s", h2, resp.Proto)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, proto := range []string{"HTTP/2.0", "HTTP/1.1"} {
		if got := seen[proto]; !strings.HasPrefix(got, "https | ") || !strings.Contains(got, "proto=https") {
			t.Errorf("the sidecar saw over %s: X-Forwarded-Proto | Forwarded = %q", proto, got)
		}
	}
}

// The TLS listener's terms: TLS 1.2 and later, a name without a
// certificate refused at once with unrecognized_name, sessions resumed.
func TestHTTPSHandshakeTerms(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	tg := startTLSGateway(t, cat, nil)
	dial := func(cfg *tls.Config) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tg.tlsAddr, cfg)
	}
	if _, err := dial(&tls.Config{ServerName: "hello.default.localhost", RootCAs: tg.pool, MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}); err == nil {
		t.Error("TLS 1.1 accepted")
	}
	start := time.Now()
	_, err := dial(&tls.Config{ServerName: "nobody.example.com", InsecureSkipVerify: true})
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Errorf("a name without a certificate: %v, want alert 112 (unrecognized_name)", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refusal took %s", d)
	}
	cache := tls.NewLRUClientSessionCache(4)
	for i, want := range []bool{false, true} {
		c, err := dial(&tls.Config{ServerName: "hello.default.localhost", RootCAs: tg.pool, ClientSessionCache: cache, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		// TLS 1.3 tickets arrive after the handshake: a request reads it.
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		t0 := time.Now()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: nobody.default.localhost\r\nConnection: close\r\n\r\n")
		if b, err := io.ReadAll(c); !strings.Contains(string(b), "404") || time.Since(t0) > 5*time.Second {
			t.Errorf("connection %d: %q, %v", i, b, err)
		}
		st := c.ConnectionState()
		c.Close()
		if st.DidResume != want || st.Version < tls.VersionTLS12 {
			t.Errorf("connection %d: resumed %v (want %v), version %x", i, st.DidResume, want, st.Version)
		}
	}
}

// HTTP/1 heads over TLS are screened as on the plain port: framing a
// front proxy could read differently is refused with 400, and nothing
// reaches an instance.
func TestHTTPSScreensHeads(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, nil)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startTLSGateway(t, cat, nil)
	c, err := tls.Dial("tcp", tg.tlsAddr, &tls.Config{ServerName: "hello.default.localhost", RootCAs: tg.pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: hello.default.localhost\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 {
		t.Errorf("CL with TE over TLS answered %d, want 400", resp.StatusCode)
	}
	if n := sc.requests.Load(); n != 0 {
		t.Errorf("%d requests reached the instance", n)
	}
}

// A revision at zero wakes for a request over HTTPS, held at the
// activator like any other.
func TestHTTPSWakesFromZero(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	as := &fakeAutoscaler{}
	sc := newFakeSidecar(t, false, nil)
	tg := startTLSGateway(t, cat, as)
	got := make(chan int, 2)
	for _, h2 := range []bool{true, false} {
		go func() {
			resp, _ := httpsGet(t, tg.client(h2), "https://hello.default.localhost/")
			got <- resp.StatusCode
		}()
	}
	waitFor(t, "requests held", func() bool { return tg.g.Revisions()[0].Queued == 2 })
	waitFor(t, "a wake", func() bool { return as.wakeCount() >= 1 })
	cat.SetAllocation(sc.allocation("hello-00001", "a1", true))
	sc.ready.Store(true)
	for range 2 {
		if code := <-got; code != 200 {
			t.Fatalf("held HTTPS request got %d", code)
		}
	}
}

// A websocket (HTTP/1.1 upgrade) runs over TLS end to end.
func TestHTTPSWebsocket(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		nc, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer nc.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo: " + line)
		brw.Flush()
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startTLSGateway(t, cat, nil)
	c, err := tls.Dial("tcp", tg.tlsAddr, &tls.Config{ServerName: "hello.default.localhost", RootCAs: tg.pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: hello.default.localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "hello over tls\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo: hello over tls\n" {
		t.Fatalf("through the tunnel: %q, %v", line, err)
	}
}

// On the plain port: ACME's challenges are answered before routing (and
// never redirected); a service that asks for it is redirected with 308 to
// HTTPS once its name has a certificate, and served as before until then.
func TestPlainPortRedirectsAndChallenges(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, nil)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startTLSGateway(t, cat, nil)
	tg.certs.challenges["/.well-known/acme-challenge/tok"] = "tok.thumb"
	noFollow := *tg.srv.Client()
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	get := func(host, path string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, tg.srv.URL+path, nil)
		req.Host = host
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	// No redirect asked: served.
	if code, _, _ := get("hello.default.localhost", "/a"); code != 200 {
		t.Fatalf("without redirect: %d", code)
	}
	svc := cat.Services()[0]
	svc.HTTPSRedirect = true
	cat.SetService(svc)
	_, port := splitHostPort(t, tg.tlsAddr)
	waitFor(t, "the redirect", func() bool { code, _, _ := get("hello.default.localhost", "/a"); return code == 308 })
	for _, c := range []struct{ host, path, loc string }{
		{"hello.default.localhost", "/a/b?x=1&y=2", "https://hello.default.localhost:" + itoa(port) + "/a/b?x=1&y=2"},
		{"Hello.Example.Com:80", "/", "https://hello.example.com:" + itoa(port) + "/"},
		{"canary-hello.default.localhost", "/t", "https://canary-hello.default.localhost:" + itoa(port) + "/t"},
	} {
		if code, loc, _ := get(c.host, c.path); code != 308 || loc != c.loc {
			t.Errorf("%s%s: %d to %q, want 308 to %q", c.host, c.path, code, loc, c.loc)
		}
	}
	// The challenge is answered, not redirected; a token path not ours is
	// routed to the service, not redirected either.
	if code, _, body := get("hello.default.localhost", "/.well-known/acme-challenge/tok"); code != 200 || body != "tok.thumb" {
		t.Errorf("challenge: %d %q", code, body)
	}
	if code, _, body := get("hello.default.localhost", "/.well-known/acme-challenge/other"); code != 200 || body != "ok from hello.default.localhost" {
		t.Errorf("a challenge path not ours: %d %q, want it routed", code, body)
	}
	// A name without a certificate is not redirected.
	tg.certs.mu.Lock()
	delete(tg.certs.certs, "hello.example.com")
	tg.certs.mu.Unlock()
	if code, _, _ := get("hello.example.com", "/"); code != 200 {
		t.Errorf("a name without a certificate: %d, want it served", code)
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_https_redirects_total", nil); n < 3 {
		t.Errorf("redirects counted %v", n)
	}
	if hosts := tg.g.Hosts(); len(hosts) != 3 || hosts[0].Host != "canary-hello.default.localhost" || hosts[0].Tag != "canary" || hosts[1].Service != "hello" {
		t.Errorf("Hosts: %+v", hosts)
	}
}

func itoa(n int) string { return big.NewInt(int64(n)).String() }
