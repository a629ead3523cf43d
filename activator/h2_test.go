package activator

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// h2cClient speaks HTTP/2 with prior knowledge, as gRPC clients without
// TLS do: every request of it shares one connection.
func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: time.Minute}
}

func h2cGet(t *testing.T, c *http.Client, url, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestH2CIsRoutedAndGoesOnAsHTTP2(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, nil)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	resp, body := h2cGet(t, h2cClient(), tg.srv.URL+"/x", "hello.default.localhost")
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || body != "ok from hello.default.localhost" {
		t.Fatalf("got %d over %s: %q", resp.StatusCode, resp.Proto, body)
	}
	if got := resp.Header.Get("X-Got-Proto"); got != "HTTP/2.0" {
		t.Errorf("the sidecar got the request over %q, want HTTP/2.0", got)
	}
	if got := resp.Header.Get("X-Got-Revision"); got != "hello-00001" {
		t.Errorf("X-Serverless-Revision at the sidecar %q", got)
	}
	// HTTP/1.1 clients still reach the sidecar over HTTP/1.1.
	code, _, hdr := tg.get(t, "hello.default.localhost", "/", nil)
	if code != 200 || hdr.Get("X-Got-Proto") != "HTTP/1.1" {
		t.Errorf("HTTP/1.1 client: %d, sidecar saw %q", code, hdr.Get("X-Got-Proto"))
	}
	// An unknown host is answered by the gateway over HTTP/2 too.
	resp, body = h2cGet(t, h2cClient(), tg.srv.URL+"/", "nobody.default.localhost")
	if resp.StatusCode != 404 || !strings.Contains(body, `no service answers on host "nobody.default.localhost"`) {
		t.Errorf("unknown host over h2c: %d %q", resp.StatusCode, body)
	}
}

// Streams on one connection are requests: each is counted against the
// revision's concurrency, so with a limit of 1 the instance never sees two
// at once, and every one is answered.
func TestH2CStreamsAreCountedOneByOne(t *testing.T) {
	cat := oneRevision(1, time.Minute)
	var mu sync.Mutex
	conns := map[string]bool{}
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		io.WriteString(w, "ok")
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	c := h2cClient()
	var clientConns sync.Map
	c.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			clientConns.Store(nc.LocalAddr().String(), true)
		}
		return nc, err
	}
	// One request first: the client's racing first requests may each dial
	// before the first connection's settings arrive.
	h2cGet(t, c, tg.srv.URL+"/warm", "hello.default.localhost")
	const streams = 40
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/%d", tg.srv.URL, i), nil)
			req.Host = "hello.default.localhost"
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "ok" {
				errs <- fmt.Errorf("stream %d: %d %q", i, resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n := 0
	clientConns.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("the client opened %d connections, want 1 (streams multiplexed)", n)
	}
	if got := sc.requests.Load(); got != streams+1 {
		t.Errorf("the instance served %d requests, want %d", got, streams+1)
	}
	if got := sc.maxConc.Load(); got != 1 {
		t.Errorf("the instance saw %d requests at once, want 1 (concurrency 1 counts streams)", got)
	}
}

// Trailers and a streamed request body pass both ways over HTTP/2 (what
// gRPC's status and client streams ride on).
func TestH2CTrailersAndFullDuplex(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		// Echo the body line by line as it arrives: the client sends
		// the next line only after it read the previous echo.
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				break
			}
		}
		w.Header().Set("Grpc-Status", "0")
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, tg.srv.URL+"/echo", pr)
	req.Host = "hello.default.localhost"
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	for i := range 3 {
		line := fmt.Sprintf("line %d\n", i)
		if _, err := io.WriteString(pw, line); err != nil {
			t.Fatal(err)
		}
		n, err := io.ReadAtLeast(resp.Body, buf, len(line))
		if err != nil || string(buf[:n]) != line {
			t.Fatalf("echo %d: %q, %v", i, buf[:n], err)
		}
	}
	pw.Close()
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after the body: %q, %v", rest, err)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
		t.Errorf("trailer Grpc-Status %q, want 0 (trailers: %v)", got, resp.Trailer)
	}
}
