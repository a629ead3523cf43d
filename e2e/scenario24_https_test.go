package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// envGRPCServer makes this test binary a gRPC server (grpc.health.v1 on
// $PORT, h2c) instead of a test run: scenario 24 deploys it as a raw_exec
// app, so a real grpc-go client talks to a real grpc-go server through the
// gateway's TLS.
const envGRPCServer = "E2E24_GRPC_SERVER"

func init() {
	if os.Getenv(envGRPCServer) == "" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("PORT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc server:", err)
		os.Exit(1)
	}
	s := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; s.GracefulStop() }()
	_ = s.Serve(ln)
	os.Exit(0)
}

// tlsDomain is the domain of scenario 24's gateways: a name the ACME CA
// accepts (Pebble refuses nothing but its block list, and certmagic orders
// no internal names such as *.localhost), which the scenario's DNS answers
// with 127.0.0.1.
const tlsDomain = "e2e24.test"

// Scenario 24: HTTPS with certificates from a real ACME server (Pebble,
// validating for real: HTTP-01 on the gateway's HTTP port, TLS-ALPN-01 on
// its HTTPS port, through a DNS answer that sends every name to 127.0.0.1)
// for three serve replicas sharing Consul: a new service's name gets one
// certificate for the cluster, every replica serves it, HTTP/2 and gRPC
// run over it, a revision at zero wakes for an HTTPS request, a
// 90-second certificate is renewed under load with no failed request, and
// with Pebble stopped the names keep their certificate while the failure
// shows in status and in the metric.
func TestE2E24HTTPSWithACME(t *testing.T) {
	pebble, err := exec.LookPath("pebble")
	if err != nil {
		t.Skip("e2e 24 skipped: pebble (Let's Encrypt's test ACME server, github.com/letsencrypt/pebble v2.10.x: go build ./cmd/pebble) is not on PATH")
	}
	h := newHarness(t, "24 https acme")
	const svc = "e2e-tls"
	const grpcSvc = "e2e-tls-grpc"
	h.cleanupService(svc)
	h.cleanupService(grpcSvc)
	h.cleanupTLSStore()

	// Replica a's ports are the ones Pebble validates on; b and c order
	// as often as a does, and their challenges are answered by a from
	// the shared store.
	ports := map[string][3]int{}
	for _, r := range []string{"a", "b", "c"} {
		ports[r] = [3]int{testbin.FreePort(t), testbin.FreePort(t), testbin.FreePort(t)}
	}
	dnsAddr := startDNS(t)
	ca := newPebbleTLS(t, h.dir)
	pb := startPebble(t, pebble, h.dir, ca, dnsAddr, ports["a"][0], ports["a"][2])
	roots := pb.issuingRoots(t, ca.pool)

	var gws []*tlsGateway
	for _, r := range []string{"a", "b", "c"} {
		gws = append(gws, h.startTLSServe("e2e-24"+r, ports[r], pb.directory, ca.file))
	}
	a, b, c := gws[0], gws[1], gws[2]
	name := svc + ".default." + tlsDomain

	// A new service's name gets a certificate: from deploy to the first
	// HTTPS 200 that verifies against Pebble's root, through b.
	file := strings.Replace(h.writeServicesText(Service{Name: svc, Env: map[string]string{"TESTAPP_NAME": "tls-v1"}, Concurrency: 10, Scaling: FastScaling()}),
		fmt.Sprintf("service %q {", svc), fmt.Sprintf("service %q {\n  https {\n    redirect = true\n  }\n", svc), 1)
	path := filepath.Join(h.dir, "tls.hcl")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h.deploy(path)
	var first *x509.Certificate
	took := eventually(t, 3*time.Minute, "an HTTPS 200 for "+name+" verified against Pebble's root", func() (bool, string) {
		o := b.get(roots, name, "/", true)
		if o.err != nil {
			return false, o.err.Error()
		}
		first = o.leaf
		return o.status == 200 && o.app == "tls-v1", fmt.Sprintf("status %d app %q", o.status, o.app)
	})
	h.timing("deploy to the first verified HTTPS 200 (3 replicas, Pebble)", time.Since(start))
	t.Logf("the first HTTPS 200 came %s after the wait began; certificate serial %s from %q, valid %s to %s",
		took, first.SerialNumber, first.Issuer.CommonName, first.NotBefore.Format(time.TimeOnly), first.NotAfter.Format(time.TimeOnly))

	// Every replica serves that certificate; Pebble took one new order
	// for the name, and the replicas counted one obtain between them.
	for _, g := range gws {
		eventually(t, 30*time.Second, g.replica+" serves a certificate of Pebble's for "+name, func() (bool, string) {
			o := g.get(roots, name, "/", true)
			if o.err != nil {
				return false, o.err.Error()
			}
			return o.status == 200, fmt.Sprintf("status %d", o.status)
		})
	}
	http01, tlsALPN := pb.challenges()
	t.Logf("Pebble: %d orders (%d new, the rest ARI renewals); challenges validated: %d http-01, %d tls-alpn-01", pb.orders(), pb.newOrders(), http01, tlsALPN)
	if n := pb.newOrders(); n != 1 {
		t.Errorf("Pebble received %d new orders for one name served by 3 replicas, want 1", n)
	}
	obtained := 0.0
	for _, g := range gws {
		n := g.metric(t, `nomad_serverless_tls_acme_orders_total{kind="obtain",result="ok"}`)
		t.Logf("replica %s obtained %v certificates", g.replica, n)
		obtained += n
	}
	if obtained != 1 {
		t.Errorf("the replicas obtained %v certificates between them, want 1 (the others read it from Consul)", obtained)
	}
	// The key and the account live under the control plane's prefix.
	if keys, _, err := h.consul.KV().Keys(consulroute.TLSStorePrefix, "", nil); err != nil || !containsSuffix(keys, name+".key") {
		t.Errorf("Consul KV under %s: %v, %v; want the certificate's key there", consulroute.TLSStorePrefix, keys, err)
	}

	// Plain HTTP is redirected; the ACME challenge path is not.
	code, loc := a.plainGet(t, name, "/p?x=1")
	if want := "https://" + name + ":" + strconv.Itoa(a.ports[2]) + "/p?x=1"; code != http.StatusPermanentRedirect || loc != want {
		t.Errorf("plain HTTP: %d to %q, want 308 to %q", code, loc, want)
	}
	if code, _ := a.plainGet(t, name, "/.well-known/acme-challenge/unknown-token"); code == http.StatusPermanentRedirect {
		t.Error("a challenge path was redirected")
	}

	// HTTP/2 over TLS, and a real gRPC client and server over it.
	if o := c.get(roots, name, "/headers", true); o.status != 200 || o.proto != "HTTP/2.0" {
		t.Errorf("h2 over TLS through c: %d over %s (%v)", o.status, o.proto, o.err)
	}
	if o := c.get(roots, name, "/headers", false); o.status != 200 || o.proto != "HTTP/1.1" || !strings.Contains(o.body, `"X-Forwarded-Proto":["https"]`) {
		t.Errorf("HTTP/1.1 over TLS through c: %d over %s: %.300s (%v)", o.status, o.proto, o.body, o.err)
	}
	ordersBefore := pb.newOrders()
	h.deployGRPC(grpcSvc)
	grpcName := grpcSvc + ".default." + tlsDomain
	eventually(t, 3*time.Minute, "a gRPC health check over TLS to "+grpcName, func() (bool, string) {
		err := grpcCheck(c.httpsAddr(), grpcName, roots)
		return err == nil, fmt.Sprint(err)
	})
	if n := pb.newOrders() - ordersBefore; n != 1 {
		t.Errorf("the gRPC service's name took %d new orders, want 1", n)
	}

	// A revision at zero wakes for an HTTPS request.
	rev := revision(svc, 1)
	h.waitZero(rev, 90*time.Second)
	wake := time.Now()
	o := b.get(roots, name, "/", true)
	if o.err != nil || o.status != 200 {
		t.Fatalf("HTTPS request at zero: %d %v", o.status, o.err)
	}
	h.timing("HTTPS request at zero (wake), h2", time.Since(wake))

	// Renewal under load: fresh connections (full handshakes) through the
	// three replicas until each has served a certificate newer than the
	// one served when the load began; no request may fail meanwhile.
	current := b.get(roots, name, "/", true)
	if current.leaf == nil {
		t.Fatalf("before the renewal: %d %v", current.status, current.err)
	}
	l := startTLSLoad(gws, roots, name)
	eventually(t, 3*time.Minute, "every replica serves a renewed certificate", func() (bool, string) {
		seen := l.serials()
		for _, g := range gws {
			renewed := false
			for s := range seen[g.replica] {
				if s != current.leaf.SerialNumber.String() && s != first.SerialNumber.String() {
					renewed = true
				}
			}
			if !renewed {
				return false, fmt.Sprintf("%s served only %v", g.replica, seen[g.replica])
			}
		}
		return true, ""
	})
	sent, failures := l.stop()
	t.Logf("renewal under load: %d requests, %d failed", sent, len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during renewal; first: %s", len(failures), sent, failures[0])
	}
	// Every order Pebble took is one the replicas counted: the two names'
	// first, then one per renewal, whichever replica made it (an order
	// in flight may be counted a moment later).
	eventually(t, 30*time.Second, "Pebble's orders match the replicas' obtains and renewals", func() (bool, string) {
		counted := 0.0
		for _, g := range gws {
			counted += g.metric(t, `nomad_serverless_tls_acme_orders_total{kind="obtain",result="ok"}`) +
				g.metric(t, `nomad_serverless_tls_acme_orders_total{kind="renew",result="ok"}`)
		}
		return float64(pb.orders()) == counted && counted > 2, fmt.Sprintf("Pebble %d orders, replicas %v", pb.orders(), counted)
	})

	// TLS-ALPN-01 on its own: every replica stops, and one that answers
	// only TLS-ALPN-01 takes a's ports. It serves the names at once from
	// Consul, with no new order, and orders a new name through the
	// challenge on its HTTPS port.
	for _, g := range gws {
		g.proc.Stop(t)
	}
	ordersBefore = pb.newOrders()
	httpBefore, alpnBefore := pb.challenges()
	d := h.startTLSServe("e2e-24d", ports["a"], pb.directory, ca.file, "-acme-challenges", "tls-alpn-01")
	eventually(t, 30*time.Second, "the new replica serves "+name+" from Consul", func() (bool, string) {
		o := d.get(roots, name, "/", true)
		return o.err == nil && o.status == 200, fmt.Sprintf("%d %v", o.status, o.err)
	})
	if n := pb.newOrders() - ordersBefore; n != 0 {
		t.Errorf("a replica that started took %d new orders for names already in Consul", n)
	}
	const alpnSvc = "e2e-tls-alpn"
	h.cleanupService(alpnSvc)
	h.deploy(h.writeServices("alpn.hcl", Service{Name: alpnSvc, Env: map[string]string{"TESTAPP_NAME": "alpn"}, Scaling: Scaling{Min: 1, Initial: 1}}))
	alpnName := alpnSvc + ".default." + tlsDomain
	eventually(t, 2*time.Minute, "an HTTPS 200 for "+alpnName, func() (bool, string) {
		o := d.get(roots, alpnName, "/", true)
		return o.err == nil && o.status == 200, fmt.Sprintf("%d %v", o.status, o.err)
	})
	httpAfter, alpnAfter := pb.challenges()
	t.Logf("TLS-ALPN-01 only: challenges http-01 %d -> %d, tls-alpn-01 %d -> %d", httpBefore, httpAfter, alpnBefore, alpnAfter)
	if alpnAfter <= alpnBefore || httpAfter != httpBefore {
		t.Errorf("the new name was not validated by TLS-ALPN-01 alone: http-01 %d -> %d, tls-alpn-01 %d -> %d", httpBefore, httpAfter, alpnBefore, alpnAfter)
	}
	gws = []*tlsGateway{d}

	// Pebble stopped: names keep their certificates while they are valid;
	// the failed renewal shows in the metric and in status.
	pb.proc.Stop(t)
	stopped := time.Now()
	l = startTLSLoad(gws, roots, name)
	eventually(t, 2*time.Minute, "a failed renewal in the metric and in status", func() (bool, string) {
		errs := 0.0
		for _, g := range gws {
			errs += g.metric(t, `nomad_serverless_tls_acme_orders_total{kind="renew",result="error"}`)
		}
		if errs == 0 {
			return false, "no renewal error counted yet"
		}
		var st struct {
			Certificates []certs.NameStatus `json:"certificates"`
		}
		// Quietly: it is asked every 250 ms.
		cmd := exec.Command(h.bin, "status", "-json", svc)
		out, err := cmd.Output()
		if err != nil || json.Unmarshal(out, &st) != nil {
			return false, fmt.Sprintf("status -json: %v", err)
		}
		for _, c := range st.Certificates {
			if c.Name == name && c.LastError != "" && c.State == "valid" {
				t.Logf("status: %s: %s, issuer %s, expires %s, last error on %s at %s: %.200s", c.Name, c.State, c.Issuer,
					c.NotAfter.Format(time.TimeOnly), c.Replica, c.LastErrorAt.Format(time.TimeOnly), c.LastError)
				return true, ""
			}
		}
		return false, fmt.Sprintf("status certificates %+v", st.Certificates)
	})
	sent, failures = l.stop()
	t.Logf("with Pebble stopped (%s): %d requests, %d failed", time.Since(stopped).Round(time.Second), sent, len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed with Pebble stopped while the certificate was valid; first: %s", len(failures), sent, failures[0])
	}
	if out := h.mustCLI("status", svc); !strings.Contains(out, "acme, valid") {
		t.Errorf("status's text lacks the certificate:\n%s", out)
	}
}

func containsSuffix(keys []string, suffix string) bool {
	for _, k := range keys {
		if strings.HasSuffix(k, suffix) {
			return true
		}
	}
	return false
}

// writeServicesText renders one service as deploy reads it.
func (h *harness) writeServicesText(s Service) string {
	if s.Binary == "" {
		s.Binary = h.bin
	}
	return s.HCL()
}

// cleanupTLSStore removes the certificates and the ACME account of the
// scenario's CA from Consul before and after: each run's Pebble is new.
func (h *harness) cleanupTLSStore() {
	clean := func() {
		if _, err := h.consul.KV().DeleteTree(consulroute.TLSKVPrefix, nil); err != nil {
			h.t.Logf("clean %s: %v", consulroute.TLSKVPrefix, err)
		}
	}
	clean()
	h.t.Cleanup(clean)
}

// deployGRPC deploys this test binary as a gRPC server (h2c, grpc.health.v1
// readiness), one instance kept up.
func (h *harness) deployGRPC(name string) {
	h.t.Helper()
	self, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	file := fmt.Sprintf(`service %q {
  task {
    driver = "raw_exec"
    config {
      command = %q
    }
    env {
      %s = "1"
    }
    protocol = %q
    resources {
      cpu    = 50
      memory = 64
    }
    kill_timeout = "3s"
  }
  readiness {
    grpc {}
  }
  scaling {
    min     = 1
    initial = 1
  }
}
`, name, self, envGRPCServer, spec.ProtocolH2C)
	path := filepath.Join(h.dir, "grpc.hcl")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.deploy(path)
}

// grpcCheck makes a unary grpc.health.v1 Check and reads the first answer
// of a Watch (server streaming) through the gateway's TLS at addr.
func grpcCheck(addr, name string, roots *x509.CertPool) error {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: name, RootCAs: roots})),
		grpc.WithAuthority(name))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("Check: %w", err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("Check: %s", resp.Status)
	}
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("Watch: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("Watch: %w", err)
	}
	if first.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("Watch: %s", first.Status)
	}
	return nil
}

// tlsGateway is one serve replica with an HTTPS port.
type tlsGateway struct {
	replica string
	proc    *testbin.Proc
	ports   [3]int // HTTP, admin, HTTPS
}

func (g *tlsGateway) httpsAddr() string { return "127.0.0.1:" + strconv.Itoa(g.ports[2]) }

// startTLSServe starts serve on 127.0.0.1 with ports (HTTP, admin,
// HTTPS), ACME from the directory, and waits until it answers /healthz and
// Consul lists it.
func (h *harness) startTLSServe(replica string, ports [3]int, directory, caFile string, extra ...string) *tlsGateway {
	h.t.Helper()
	args := []string{"serve",
		"-listen", "127.0.0.1:" + strconv.Itoa(ports[0]),
		"-admin-listen", "127.0.0.1:" + strconv.Itoa(ports[1]),
		"-https-port", strconv.Itoa(ports[2]),
		"-domain", tlsDomain, "-replica", replica,
		"-acme-directory", directory, "-acme-email", "e2e@" + tlsDomain, "-acme-ca-root", caFile,
		// Pebble's certificates here live 90 s.
		"-acme-renew-check", "2s",
	}
	args = append(args, extra...)
	p := testbin.Start(h.t, h.bin, args, h.env)
	g := &tlsGateway{replica: replica, proc: p, ports: ports}
	eventually(h.t, 30*time.Second, "serve "+replica+" answers /healthz", func() (bool, string) {
		select {
		case <-p.Done():
			h.t.Fatalf("serve exited:\n%s", p.Output())
		default:
		}
		status, _, err := getBody(NewClient(1), "http://127.0.0.1:"+strconv.Itoa(ports[1])+"/healthz")
		return err == nil && status == 200, fmt.Sprintf("status %d %v", status, err)
	})
	eventually(h.t, 30*time.Second, "Consul lists serve "+replica, func() (bool, string) {
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if e.Service.Meta[consulroute.MetaReplica] == replica && e.Service.Meta[consulroute.MetaHTTPSPort] == strconv.Itoa(ports[2]) {
				return true, ""
			}
		}
		return false, "not yet"
	})
	return g
}

// httpsOutcome is one HTTPS request's result.
type httpsOutcome struct {
	status int
	proto  string
	app    string
	body   string
	leaf   *x509.Certificate
	err    error
}

// get sends GET path for name to the replica's HTTPS port on a new
// connection, verifying against roots, over h2 or HTTP/1.1.
func (g *tlsGateway) get(roots *x509.CertPool, name, path string, h2 bool) httpsOutcome {
	var p http.Protocols
	p.SetHTTP2(h2)
	p.SetHTTP1(!h2)
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		Protocols:         &p,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", g.httpsAddr())
		},
	}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + name + path)
	if err != nil {
		return httpsOutcome{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	o := httpsOutcome{status: resp.StatusCode, proto: resp.Proto, app: resp.Header.Get("X-Testapp-Name"), body: string(b), err: err}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		o.leaf = resp.TLS.PeerCertificates[0]
	}
	return o
}

// plainGet sends a plain HTTP GET and returns the status and Location.
func (g *tlsGateway) plainGet(t *testing.T, name, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(g.ports[0])+path, nil)
	req.Host = name
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("plain GET %s%s: %v", name, path, err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

// metric reads one sample of the replica's /metrics (0 when absent).
func (g *tlsGateway) metric(t *testing.T, series string) float64 {
	t.Helper()
	_, body, err := getBody(NewClient(1), "http://127.0.0.1:"+strconv.Itoa(g.ports[1])+"/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", g.replica, err)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// tlsLoad sends HTTPS requests on new connections through every replica
// in turn, recording failures and the certificates seen.
type tlsLoad struct {
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	sent     int
	failures []string
	seen     map[string]map[string]bool // replica -> serials
}

func startTLSLoad(gws []*tlsGateway, roots *x509.CertPool, name string) *tlsLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &tlsLoad{cancel: cancel, done: make(chan struct{}), seen: map[string]map[string]bool{}}
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			g := gws[i%len(gws)]
			o := g.get(roots, name, "/", i%2 == 0)
			l.mu.Lock()
			l.sent++
			switch {
			case o.err != nil:
				l.failures = append(l.failures, fmt.Sprintf("%s: %v", g.replica, o.err))
			case o.status != 200:
				l.failures = append(l.failures, fmt.Sprintf("%s: status %d %.200s", g.replica, o.status, o.body))
			}
			if o.leaf != nil {
				if l.seen[g.replica] == nil {
					l.seen[g.replica] = map[string]bool{}
				}
				l.seen[g.replica][o.leaf.SerialNumber.String()] = true
			}
			l.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return l
}

func (l *tlsLoad) serials() map[string]map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]map[string]bool{}
	for r, s := range l.seen {
		out[r] = map[string]bool{}
		for k := range s {
			out[r][k] = true
		}
	}
	return out
}

func (l *tlsLoad) stop() (int, []string) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, l.failures
}

// startDNS answers every A question with 127.0.0.1 (UDP and TCP), as the
// DNS Pebble's validation asks; it returns its address.
func startDNS(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 10}, A: net.IPv4(127, 0, 0, 1)})
			}
		}
		_ = w.WriteMsg(m)
	})
	udp := &dns.Server{PacketConn: pc, Handler: handler}
	tcp := &dns.Server{Listener: ln, Handler: handler}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
	return addr
}

// pebbleTLS is the CA of Pebble's own HTTPS (its directory and management
// API), made by the test.
type pebbleTLS struct {
	file, certFile, keyFile string
	pool                    *x509.CertPool
}

func newPebbleTLS(t *testing.T, dir string) pebbleTLS {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e 24 Pebble listener CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	p := pebbleTLS{file: filepath.Join(dir, "pebble-ca.pem"), certFile: filepath.Join(dir, "pebble.pem"), keyFile: filepath.Join(dir, "pebble.key"), pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	for f, b := range map[string][]byte{
		p.file:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		p.keyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// pebbleProc is a running Pebble.
type pebbleProc struct {
	proc                  *testbin.Proc
	directory, management string
}

// startPebble runs Pebble on free ports, validating HTTP-01 on httpPort
// and TLS-ALPN-01 on tlsPort of whatever dnsAddr resolves (127.0.0.1),
// issuing 90-second certificates. Validation is real: no
// PEBBLE_VA_ALWAYS_VALID; authorizations are not reused (every renewal
// validates again); no random sleeps or nonce rejections (they only slow
// the run).
func startPebble(t *testing.T, bin, dir string, ca pebbleTLS, dnsAddr string, httpPort, tlsPort int) *pebbleProc {
	t.Helper()
	listen, mgmt := testbin.FreePort(t), testbin.FreePort(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  "127.0.0.1:" + strconv.Itoa(listen),
		"managementListenAddress":        "127.0.0.1:" + strconv.Itoa(mgmt),
		"certificate":                    ca.certFile,
		"privateKey":                     ca.keyFile,
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
		"profiles": map[string]any{
			"default": map[string]any{"description": "90-second certificates, for renewals within the scenario", "validityPeriod": 90},
		},
	}}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := testbin.Start(t, bin, []string{"-config", path, "-dnsserver", dnsAddr}, map[string]string{
		"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_AUTHZREUSE": "0", "PEBBLE_WFE_NONCEREJECT": "0",
	})
	p.WaitPort(t, listen, 30*time.Second)
	p.WaitPort(t, mgmt, 30*time.Second)
	return &pebbleProc{proc: p, directory: "https://127.0.0.1:" + strconv.Itoa(listen) + "/dir", management: "https://127.0.0.1:" + strconv.Itoa(mgmt)}
}

// issuingRoots is Pebble's issuing root (it makes a new one at every
// start), as the pool clients verify against.
func (p *pebbleProc) issuingRoots(t *testing.T, listenerCA *x509.CertPool) *x509.CertPool {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: listenerCA}}}
	resp, err := c.Get(p.management + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("Pebble's root: %q", b)
	}
	return pool
}

// orders counts the orders Pebble took (its log says each).
func (p *pebbleProc) orders() int {
	return strings.Count(p.proc.Output(), "Added order ")
}

// newOrders counts the orders that are not ARI renewals. Pebble's
// renewal window for a certificate as short-lived as the scenario's
// spans its whole validity (its ±24 h around the two-thirds mark is
// clamped to issue and expiry), so certmagic may renew, rightly, a second
// after it obtained; "one order per name" means one new order.
func (p *pebbleProc) newOrders() int {
	out := p.proc.Output()
	return strings.Count(out, "Added order ") - strings.Count(out, " is a replacement of ")
}

// challenges counts the challenges Pebble validated by type: it logs
// each task it takes, and each HTTP-01 attempt of its validators
// ("Starting N validations" a task: multi-perspective validation).
func (p *pebbleProc) challenges() (http01, tlsALPN01 int) {
	out := p.proc.Output()
	tasks := strings.Count(out, "Pulled a task from the Tasks queue")
	perTask := 1
	if m := validationsRE.FindStringSubmatch(out); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
			perTask = n
		}
	}
	http01 = strings.Count(out, "Attempting to validate w/ HTTP: ") / perTask
	return http01, tasks - http01
}

// validationsRE reads how many validators Pebble runs per challenge.
var validationsRE = regexp.MustCompile(`Starting (\d+) validations`)
