package testapp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// fetchLimit bounds the body /fetch relays; fetchTimeout the whole call.
const (
	fetchLimit   = 64 << 10
	fetchTimeout = 30 * time.Second
)

// newFetchClient is the client /fetch calls out with: no proxy from the
// environment, no redirects followed (the answer is relayed as it came),
// and a dialer that refuses every address but loopback and private ones,
// checked on the address dialed, so neither a redirect nor a name that
// resolves elsewhere takes the app outside the test's network.
func newFetchClient() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: fetchTimeout,
		Transport: &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, _, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				if ip := net.ParseIP(host); ip == nil || !(ip.IsLoopback() || ip.IsPrivate()) {
					return nil, fmt.Errorf("testapp /fetch calls loopback and private addresses only, not %s", addr)
				}
				return d.DialContext(ctx, network, addr)
			},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// serveFetch is GET /fetch?url=http://IP:port/path[&host=H]: the app calls
// url itself (with Host H when given), as one service calls another, and
// answers with the status and the body (at most 64 KiB) it got, the
// callee's X-Testapp-Name as X-Testapp-Fetched-Name. Only http:// URLs to
// loopback or private IP addresses are called (the app is a test tool,
// not an open proxy); anything else is 400, a failed call 502.
func (a *App) serveFetch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	u, err := url.Parse(q.Get("url"))
	if err != nil || u.Scheme != "http" || u.Host == "" {
		http.Error(w, "fetch: want url=http://<loopback or private IP>:<port>/<path>", http.StatusBadRequest)
		return
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !(ip.IsLoopback() || ip.IsPrivate()) {
		http.Error(w, "fetch: the url's host must be a loopback or private IP address, not "+u.Hostname(), http.StatusBadRequest)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		http.Error(w, "fetch: "+err.Error(), http.StatusBadRequest)
		return
	}
	if h := q.Get("host"); h != "" {
		req.Host = h
	}
	resp, err := a.fetch.Do(req)
	if err != nil {
		http.Error(w, "fetch: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, fetchLimit))
	if err != nil {
		http.Error(w, "fetch: read the answer: "+err.Error(), http.StatusBadGateway)
		return
	}
	h := w.Header()
	h["Content-Type"] = textPlain
	if n := resp.Header.Get("X-Testapp-Name"); n != "" {
		h.Set("X-Testapp-Fetched-Name", n)
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
}
