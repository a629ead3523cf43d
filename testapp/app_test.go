package testapp_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

func newApp(t *testing.T, cfg testapp.Config) (*testapp.App, *httptest.Server) {
	t.Helper()
	app := testapp.New(cfg)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	return app, srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
}

func TestMaxConcurrencyAndCount(t *testing.T) {
	app, srv := newApp(t, testapp.Config{})
	const n = 8
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _ := get(t, srv.URL+"/?sleep=200ms"); code != 200 {
				t.Errorf("status %d", code)
			}
		}()
	}
	wg.Wait()
	st := app.Stats()
	if st.Requests != n || st.InFlight != 0 {
		t.Fatalf("stats %+v, want %d requests and none in flight", st, n)
	}
	// Eight clients sleeping 200 ms each overlap; at least two must have
	// been seen together, and never more than were sent.
	if st.MaxConcurrency < 2 || st.MaxConcurrency > n {
		t.Fatalf("max concurrency %d, want 2..%d", st.MaxConcurrency, n)
	}
	post(t, srv.URL+"/reset")
	if st := app.Stats(); st.Requests != 0 || st.MaxConcurrency != 0 {
		t.Fatalf("after reset %+v", st)
	}
	// Control routes do not count as work.
	get(t, srv.URL+"/ready")
	get(t, srv.URL+"/stats")
	if st := app.Stats(); st.Requests != 0 {
		t.Fatalf("control routes counted: %+v", st)
	}
}

func TestReadiness(t *testing.T) {
	app, srv := newApp(t, testapp.Config{ReadyDelay: 300 * time.Millisecond})
	if code, _ := get(t, srv.URL+"/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("ready before delay: %d", code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := get(t, srv.URL+"/ready")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := app.Stats()
	if st.ReadyOK != 1 || st.ReadyFailed < 1 || st.FirstReadyUnixNano == 0 {
		t.Fatalf("stats %+v", st)
	}
	post(t, srv.URL+"/fail-ready")
	if code, _ := get(t, srv.URL+"/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("ready after fail-ready: %d", code)
	}
	post(t, srv.URL+"/ready-ok")
	if code, _ := get(t, srv.URL+"/ready"); code != 200 {
		t.Fatalf("not ready after ready-ok: %d", code)
	}
	post(t, srv.URL+"/fail-live")
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusServiceUnavailable {
		t.Fatalf("live after fail-live: %d", code)
	}
	post(t, srv.URL+"/live-ok")
	if code, _ := get(t, srv.URL+"/healthz"); code != 200 {
		t.Fatalf("not live after live-ok: %d", code)
	}
	if st := app.Stats(); st.HealthzCalls != 2 {
		t.Fatalf("healthz calls %d, want 2", st.HealthzCalls)
	}
}

func TestQueryParameters(t *testing.T) {
	_, srv := newApp(t, testapp.Config{})
	if code, _ := get(t, srv.URL+"/?status=503"); code != 503 {
		t.Fatalf("status=503 gave %d", code)
	}
	if _, body := get(t, srv.URL+"/?size=100000"); len(body) != 100000 {
		t.Fatalf("size=100000 gave %d bytes", len(body))
	}
	if code, body := get(t, srv.URL+"/?stream=3"); code != 200 || body != "chunk 1\nchunk 2\nchunk 3\n" {
		t.Fatalf("stream=3 gave %d %q", code, body)
	}
	if code, _ := get(t, srv.URL+"/?sleep=bogus"); code != 400 {
		t.Fatalf("bad sleep gave %d", code)
	}
	resp, err := http.Get(srv.URL + "/headers")
	if err != nil {
		t.Fatal(err)
	}
	var req testapp.Request
	err = json.NewDecoder(resp.Body).Decode(&req)
	resp.Body.Close()
	if err != nil || req.Method != "GET" || req.Proto != "HTTP/1.1" || req.Headers["User-Agent"] == nil {
		t.Fatalf("headers: %+v %v", req, err)
	}
}

// The gate holds the stream after its first chunk, so the first chunk is
// seen by the client while the second does not exist yet.
func TestStreamGate(t *testing.T) {
	_, srv := newApp(t, testapp.Config{})
	resp, err := http.Get(srv.URL + "/?stream=2&gate=g1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "chunk 1\n" {
		t.Fatalf("first chunk %q %v", line, err)
	}
	post(t, srv.URL+"/release?gate=g1")
	line, err = br.ReadString('\n')
	if err != nil || line != "chunk 2\n" {
		t.Fatalf("second chunk %q %v", line, err)
	}
}

// The binary honours PORT and TESTAPP_START_DELAY and stops on SIGTERM.
func TestBinary(t *testing.T) {
	bin := testbin.Path(t)
	port := testbin.FreePort(t)
	p := testbin.Start(t, bin, []string{"testapp"}, map[string]string{
		testapp.EnvPort:       strconv.Itoa(port),
		testapp.EnvStartDelay: "100ms",
		testapp.EnvName:       "a1",
	})
	p.WaitPort(t, port, 10*time.Second)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok\n" || resp.Header.Get("X-Testapp-Name") != "a1" {
		t.Fatalf("got %q name %q", b, resp.Header.Get("X-Testapp-Name"))
	}
	if code := p.Stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM\n%s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "stopped") {
		t.Fatalf("no stop log:\n%s", p.Output())
	}

	bad := testbin.Start(t, bin, []string{"testapp"}, map[string]string{testapp.EnvPort: "nope"})
	if code, err := bad.Wait(10 * time.Second); err != nil || code != 2 || !strings.Contains(bad.Output(), "PORT") {
		t.Fatalf("bad PORT: code %d err %v output %q", code, err, bad.Output())
	}
}

// /file serves what an init step or a volume put in the instance.
func TestFile(t *testing.T) {
	_, srv := newApp(t, testapp.Config{})
	dir := t.TempDir()
	p := filepath.Join(dir, "migration.txt")
	if err := os.WriteFile(p, []byte("migrated v7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, srv.URL+"/file?path="+url.QueryEscape(p)); code != 200 || body != "migrated v7\n" {
		t.Errorf("existing file: %d %q", code, body)
	}
	if code, _ := get(t, srv.URL+"/file?path="+url.QueryEscape(filepath.Join(dir, "none"))); code != 404 {
		t.Errorf("missing file: %d, want 404", code)
	}
	if code, _ := get(t, srv.URL+"/file"); code != 400 {
		t.Errorf("no path: %d, want 400", code)
	}
}

func TestFailPercent(t *testing.T) {
	_, srv := newApp(t, testapp.Config{FailPercent: 30})
	failed := 0
	for range 200 {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusInternalServerError {
			failed++
		}
	}
	if failed != 60 {
		t.Errorf("%d of 200 requests answered 500, want 60 (30%%)", failed)
	}
	// An explicit status query still wins.
	resp, err := http.Get(srv.URL + "/?status=204")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("status=204 answered %d", resp.StatusCode)
	}
	if _, err := testapp.ConfigFromEnv(func(k string) string {
		return map[string]string{testapp.EnvPort: "8080", testapp.EnvFailPercent: "101"}[k]
	}); err == nil {
		t.Error("TESTAPP_FAIL_PERCENT=101 was taken")
	}
}
