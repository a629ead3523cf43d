package main

import (
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
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/certs"
)

// Targets of the HTTPS gateway (issue 34), against HAProxy terminating TLS
// with the same certificate in front of the same sidecar.
const (
	targetTLSRPS        = 1.0 // keep-alive HTTPS req/s, at least HAProxy's
	targetTLSP99        = 1.2 // p99 at most this times HAProxy's
	targetTLSHandshakes = 0.8 // new TLS connections a second, at least this times HAProxy's
	targetTLSRSSMiB     = 150 // the gateway's RSS with tlsExtraCerts certificates loaded
	tlsExtraCerts       = 1000
)

// runTLSBench measures the gateway's HTTPS port against HAProxy's, both in
// front of the same sidecar and app, with the same ECDSA P-256
// certificate, in alternating rounds: keep-alive throughput and latency
// (HTTP/1.1 over TLS, o.Conns connections), one connection's latency, and
// new connections a second (each request on a connection of its own: a
// full TLS 1.3 handshake, no resumption). The gateway holds 1,000 more
// certificates throughout, so its peak RSS is that of a gateway serving
// 1,000 names.
//
// Clients offer X25519 only: Go's default first share, X25519MLKEM768,
// is one HAProxy's OpenSSL 3.0 cannot take, and a handshake the two ends
// settle differently would not compare the proxies.
func runTLSBench(ctx context.Context, o Options) error {
	dir, err := os.MkdirTemp("", "loadbench-tls-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	svc := gatewayBenchSvc{Service: "bench"}
	pair, combined, err := writeBenchCerts(dir, svc.host(), tlsExtraCerts)
	if err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	appPort, scPort, scAdmin := ports[0], ports[1], ports[2]
	app, err := startApp(o.Bin, "testapp", appPort, nil)
	if err != nil {
		return err
	}
	defer app.stop(5 * time.Second)
	sc, err := startSidecar(o.Bin, "sidecar", scPort, appPort, scAdmin, 0, nil)
	if err != nil {
		return err
	}
	defer sc.stop(5 * time.Second)
	svc.Instances = []string{addrOf(scPort)}

	gwPorts, err := freePorts(2)
	if err != nil {
		return err
	}
	gw, err := startGatewayChildConfig("gateway", gatewayChildConfig{
		Listen: addrOf(gwPorts[0]), TLSListen: addrOf(gwPorts[1]), Policy: activator.PolicyAuto,
		Routes: []gatewayBenchSvc{svc}, CertFiles: pair,
	}, o.ProxyEnv, gwPorts...)
	if err != nil {
		return err
	}
	defer gw.stop(5 * time.Second)
	rssLoaded, _ := peakRSS(gw.pid())
	hpPeer := haproxyTLSPeer(combined)
	bin, skip := locatePeer(hpPeer, exec.LookPath)
	if skip != "" {
		// Every target here is a ratio to HAProxy's: nothing to say
		// without it.
		fmt.Fprintf(o.Out, "the TLS benchmark compares the gateway with HAProxy and skips without it: %s\n", skip)
		return nil
	}
	hp, err := startPeer(hpPeer, bin, addrOf(scPort))
	if err != nil {
		return err
	}
	defer hp.stop()

	client := &tls.Config{ServerName: svc.host(), InsecureSkipVerify: true, CurvePreferences: []tls.CurveID{tls.X25519},
		NextProtos: []string{"http/1.1"}}
	ours := Target{Name: "gateway (TLS)+sidecar", Addr: addrOf(gwPorts[1]), Host: svc.host(), TLS: client}
	theirs := Target{Name: "haproxy (TLS)+sidecar", Addr: hp.Addr, Host: svc.host(), TLS: client}
	plain := Target{Name: "gateway (plain)+sidecar", Addr: addrOf(gwPorts[0]), Host: svc.host()}
	for _, t := range []Target{ours, theirs, plain} {
		r := Run(ctx, t, Load{Conns: o.Conns, Duration: o.Warmup})
		if r.Requests == 0 || r.ByClass[2] != r.Requests {
			return fmt.Errorf("warm-up of %s: %d requests, %d 2xx, %d errors", t.Name, r.Requests, r.ByClass[2], r.Errors)
		}
	}

	type series struct{ ka, one, hs *Series }
	mk := func(name string) series {
		return series{&Series{Name: name}, &Series{Name: name}, &Series{Name: name}}
	}
	sOurs, sTheirs, sPlain := mk(ours.Name), mk(theirs.Name), mk(plain.Name)
	cpuOf := func(t Target) func() time.Duration {
		switch t.Name {
		case ours.Name, plain.Name:
			return func() time.Duration { d, _ := cpuTime(gw.pid()); return d }
		default:
			return hp.cpu
		}
	}
	run := func(t Target, l Load, s *Series, round int) error {
		cpu := cpuOf(t)
		before := cpu()
		idle := s.measureIdle()
		r := Run(ctx, t, l)
		idle()
		s.CPU += cpu() - before
		s.Add(r)
		PrintRun(o.Out, round, r)
		return ctx.Err()
	}
	phases := []struct {
		title string
		load  Load
		pick  func(series) *Series
		with  []Target
	}{
		{fmt.Sprintf("keep-alive HTTPS, %d connections", o.Conns), Load{Conns: o.Conns, Duration: o.Duration}, func(s series) *Series { return s.ka }, []Target{ours, theirs, plain}},
		{"keep-alive HTTPS, 1 connection", Load{Conns: 1, Duration: o.SingleDuration}, func(s series) *Series { return s.one }, []Target{ours, theirs}},
		{fmt.Sprintf("a new TLS connection per request, %d at a time", o.Conns), Load{Conns: o.Conns, Duration: o.Duration, NewConnEach: true}, func(s series) *Series { return s.hs }, []Target{ours, theirs}},
	}
	byName := map[string]series{ours.Name: sOurs, theirs.Name: sTheirs, plain.Name: sPlain}
	for _, ph := range phases {
		fmt.Fprintf(o.Out, "\n%s, alternating\n", ph.title)
		for round := 1; round <= o.Rounds; round++ {
			for _, t := range ph.with {
				if err := run(t, ph.load, ph.pick(byName[t.Name]), round); err != nil {
					return err
				}
			}
		}
	}

	fmt.Fprintf(o.Out, "\n== HTTPS: gateway vs HAProxy terminating TLS (same certificate, same sidecar; medians of %d rounds)\n", o.Rounds)
	row := func(what string, a, b *Series) (roundStats, roundStats) {
		ma, mb := medianStats(a), medianStats(b)
		cpuA := a.CPU / time.Duration(max(a.Merged().Requests, 1))
		cpuB := b.CPU / time.Duration(max(b.Merged().Requests, 1))
		fmt.Fprintf(o.Out, "%-34s ours %8.0f/s p50 %7s p99 %7s CPU/req %6s | haproxy %8.0f/s p50 %7s p99 %7s CPU/req %6s\n", what,
			ma.RPS, fmtDur(ma.P50), fmtDur(ma.P99), fmtDur(cpuA), mb.RPS, fmtDur(mb.P50), fmtDur(mb.P99), fmtDur(cpuB))
		return ma, mb
	}
	kaO, kaT := row(fmt.Sprintf("keep-alive, %d conns", o.Conns), sOurs.ka, sTheirs.ka)
	oneO, oneT := row("keep-alive, 1 conn", sOurs.one, sTheirs.one)
	hsO, hsT := row(fmt.Sprintf("new connections, %d at a time", o.Conns), sOurs.hs, sTheirs.hs)
	pl := medianStats(sPlain.ka)
	fmt.Fprintf(o.Out, "%-34s ours %8.0f/s p50 %7s p99 %7s CPU/req %6s (plain HTTP on the same gateway, its keep-alive loop: for scale)\n", fmt.Sprintf("plain keep-alive, %d conns", o.Conns),
		pl.RPS, fmtDur(pl.P50), fmtDur(pl.P99), fmtDur(sPlain.ka.CPU/time.Duration(max(sPlain.ka.Merged().Requests, 1))))

	rss, _ := peakRSS(gw.pid())
	fmt.Fprintf(o.Out, "\n== summary (target in brackets)\n")
	v := div(kaO.RPS, kaT.RPS)
	fmt.Fprintf(o.Out, "keep-alive HTTPS req/s vs haproxy, %d conns: %.3f  [>= %.2f] %s\n", o.Conns, v, targetTLSRPS, verdict(v >= targetTLSRPS))
	v = divDur(kaO.P99, kaT.P99)
	fmt.Fprintf(o.Out, "keep-alive HTTPS p99 vs haproxy, %d conns:   %.2fx  [<= %.2fx] %s\n", o.Conns, v, targetTLSP99, verdict(v <= targetTLSP99))
	v = divDur(oneO.P99, oneT.P99)
	fmt.Fprintf(o.Out, "keep-alive HTTPS p99 vs haproxy, 1 conn:     %.2fx  [<= %.2fx] %s\n", v, targetTLSP99, verdict(v <= targetTLSP99))
	v = div(hsO.RPS, hsT.RPS)
	fmt.Fprintf(o.Out, "new TLS connections/s vs haproxy:            %.3f  [>= %.2f] %s\n", v, targetTLSHandshakes, verdict(v >= targetTLSHandshakes))
	fmt.Fprintf(o.Out, "gateway RSS with %d certificates: %s after loading them, %s peak  [< %d MiB] %s\n", tlsExtraCerts+1,
		fmtMiB(rssLoaded), fmtMiB(rss), targetTLSRSSMiB, verdict(rss < targetTLSRSSMiB<<20))
	return nil
}

// startGatewayChildConfig runs the gateway process with cfg and waits for
// every one of ports.
func startGatewayChildConfig(name string, cfg gatewayChildConfig, extraEnv map[string]string, ports ...int) (*proc, error) {
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable to start the gateway: %w", err)
	}
	env := map[string]string{envGatewayChild: string(js)}
	for k, v := range extraEnv {
		env[k] = v
	}
	p, err := startProc(name, self, nil, env)
	if err != nil {
		return nil, err
	}
	for _, port := range ports {
		// 1,001 certificates take a moment to read.
		if err := p.waitPort(port, 60*time.Second); err != nil {
			p.stop(time.Second)
			return nil, err
		}
	}
	return p, nil
}

// haproxyTLSPeer is HAProxy as haproxyPeer runs it, terminating TLS with
// the certificate (and key) in pem, ALPN http/1.1.
func haproxyTLSPeer(pem string) peerKind {
	k := haproxyPeer()
	k.Name = "haproxy-tls"
	k.Config = func(_, listen, upstream string) string {
		return fmt.Sprintf(`# Written by loadbench: HAProxy terminating TLS in front of %[2]s.
global
	nbthread 2
	maxconn 4096
	ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
	mode http
	option http-keep-alive
	http-reuse always
	timeout connect 5s
	timeout client 60s
	timeout server 60s
	timeout http-keep-alive 60s

frontend bench
	bind %[1]s ssl crt %[3]s alpn http/1.1
	default_backend app

backend app
	server app %[2]s maxconn 1024
`, listen, upstream, pem)
	}
	return k
}

// writeBenchCerts writes the benchmark's certificate for name (ECDSA P-256,
// signed by a CA of its own) as a file pair and as one PEM with the key
// (HAProxy's form), and extra more certificates for other names: the pairs
// to load, the first being name's.
func writeBenchCerts(dir, name string, extra int) ([]certs.FilePair, string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "loadbench CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, "", err
	}
	ca, _ := x509.ParseCertificate(caDER)
	var pairs []certs.FilePair
	var combined string
	for i := range extra + 1 {
		n := name
		if i > 0 {
			n = "n" + strconv.Itoa(i) + ".loaded.example.com"
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, "", err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: n}, DNSNames: []string{n},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, "", err
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})...)
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
		p := certs.FilePair{Cert: filepath.Join(dir, fmt.Sprintf("c%d.pem", i)), Key: filepath.Join(dir, fmt.Sprintf("c%d.key", i))}
		if err := os.WriteFile(p.Cert, chain, 0o600); err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(p.Key, keyPEM, 0o600); err != nil {
			return nil, "", err
		}
		pairs = append(pairs, p)
		if i == 0 {
			combined = filepath.Join(dir, "haproxy.pem")
			if err := os.WriteFile(combined, append(append([]byte{}, chain...), keyPEM...), 0o600); err != nil {
				return nil, "", err
			}
		}
	}
	return pairs, combined, nil
}
