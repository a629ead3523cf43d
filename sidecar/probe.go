package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// prober runs one check of the app; nil means it passed.
type prober interface {
	probe(ctx context.Context) error
}

// newProber returns the prober for p against the app on host; h2c: the app
// speaks HTTP/2 without TLS, so an http probe does too.
func newProber(p spec.Probe, host string, appPort int, h2c bool) (prober, error) {
	port := p.Port
	if port == 0 {
		port = appPort
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	switch p.Type {
	case spec.ProbeHTTP:
		return newHTTPProber(addr, p.Path, p.Headers, h2c), nil
	case spec.ProbeTCP:
		return &tcpProber{addr: addr}, nil
	case spec.ProbeGRPC:
		return newGRPCProber(addr, p.GRPCService), nil
	case spec.ProbeExec:
		if len(p.Command) == 0 {
			return nil, errors.New("exec probe has no command")
		}
		return &execProber{argv: p.Command}, nil
	}
	return nil, fmt.Errorf("probe type %q is not supported (want http, tcp, grpc or exec)", p.Type)
}

// tcpProber passes when the port accepts a connection.
type tcpProber struct {
	addr   string
	dialer net.Dialer
}

func (t *tcpProber) probe(ctx context.Context) error {
	c, err := t.dialer.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return err
	}
	// net.Dialer knows nothing of httptrace; the probe loop learns of
	// the app's first accepted connection through it all the same.
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.ConnectDone != nil {
		tr.ConnectDone("tcp", t.addr, nil)
	}
	return c.Close()
}

// httpProber passes on a 2xx or 3xx answer to a GET, as Kubernetes' does.
// It opens a new connection each time, so a probe never rides on a
// connection the app has stopped serving.
type httpProber struct {
	url    string
	host   string
	header http.Header
	client *http.Client
}

func newHTTPProber(addr, path string, headers map[string]string, h2c bool) *httpProber {
	h := http.Header{"User-Agent": {"nomad-serverless-probe"}}
	host := ""
	for k, v := range headers {
		if strings.EqualFold(k, "Host") {
			host = v
			continue
		}
		h.Set(k, v)
	}
	return &httpProber{
		url:    "http://" + addr + path,
		host:   host,
		header: h,
		client: &http.Client{
			Transport: probeTransport(h2c),
			// A redirect counts as success without being followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// probeTransport opens a connection per probe, over HTTP/1.1 or h2c.
func probeTransport(h2c bool) *http.Transport {
	t := &http.Transport{Proxy: nil, DisableKeepAlives: true, DisableCompression: true}
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		t.Protocols = &p
	}
	return t
}

func (p *httpProber) probe(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return err
	}
	req.Header = p.header.Clone()
	if p.host != "" {
		req.Host = p.host
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s: %s", p.url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// execProber passes when its command exits 0. The command runs in the
// sidecar's task, beside (not inside) the user's task.
type execProber struct{ argv []string }

func (e *execProber) probe(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, e.argv[0], e.argv[1:]...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if len(out) > 512 {
			out = out[:512]
		}
		return fmt.Errorf("%s: %w: %s", strings.Join(e.argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
