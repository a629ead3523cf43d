package testapp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// /fetch calls another app with the Host given and relays its status,
// body and name; it calls only loopback and private IP addresses over
// plain http.
func TestFetch(t *testing.T) {
	var sawHost string
	callee := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawHost = r.Host
		w.Header().Set("X-Testapp-Name", "callee")
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("from the callee"))
	})
	calleeSrv := httptest.NewServer(callee)
	t.Cleanup(calleeSrv.Close)
	_, caller := newApp(t, testapp.Config{})

	resp, err := http.Get(caller.URL + "/fetch?" + url.Values{"url": {calleeSrv.URL + "/x"}, "host": {"billing.default.localhost"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTeapot || body != "from the callee" || resp.Header.Get("X-Testapp-Fetched-Name") != "callee" {
		t.Errorf("fetch: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if sawHost != "billing.default.localhost" {
		t.Errorf("the callee saw Host %q", sawHost)
	}

	for _, bad := range []string{"https://127.0.0.1:1/", "http://example.com/", "http://8.8.8.8/", "file:///etc/passwd", ""} {
		code, msg := get(t, caller.URL+"/fetch?"+url.Values{"url": {bad}}.Encode())
		if code != http.StatusBadRequest || !strings.HasPrefix(msg, "fetch:") {
			t.Errorf("fetch %q: %d %q, want 400", bad, code, msg)
		}
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
