package consulroute

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

const consulDir = "consul-1.16/"

// fx loads a Consul fixture by its file name.
func fx(t testing.TB, name string) fixtures.Exchange {
	t.Helper()
	return fixtures.Load(t, consulDir+name)
}

// synthetic builds an exchange the recordings do not hold (for example a
// list of service-defaults), shaped like Consul 1.16's answers.
func synthetic(name, method, path string, query map[string]string, status int, index string, body any) fixtures.Exchange {
	q := fixtures.Query{}
	for k, v := range query {
		q.Set(k, v)
	}
	headers := map[string]string{"Content-Type": "application/json"}
	if index != "" {
		headers["X-Consul-Index"] = index
	}
	var raw json.RawMessage
	switch b := body.(type) {
	case nil:
		raw = json.RawMessage("null")
	case string:
		raw = fixtures.TextBody(b)
		headers["Content-Type"] = "text/plain; charset=utf-8"
	default:
		raw, _ = json.Marshal(b)
	}
	return fixtures.Exchange{
		Name:     "synthetic: " + name,
		Request:  fixtures.Request{Method: method, Path: path, Query: q, Body: json.RawMessage("null")},
		Response: fixtures.Response{Status: status, Headers: headers, Body: raw},
	}
}

// withPath re-targets a recorded exchange at another path (same answer).
func withPath(e fixtures.Exchange, path string) fixtures.Exchange {
	e.Request.Path = path
	e.Name += " (at " + path + ")"
	return e
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testClient(t testing.TB, addr string, opts ...Option) *Client {
	t.Helper()
	opts = append([]Option{
		WithReplica("r1"),
		WithLogger(quietLogger()),
		WithBackoff(time.Millisecond, 20*time.Millisecond),
	}, opts...)
	c, err := NewClient(&api.Config{Address: addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replayClient serves exchanges with the shared replay helper and returns a
// client talking to it.
func replayClient(t testing.TB, exchanges ...fixtures.Exchange) (*Client, *fixtures.Replay) {
	t.Helper()
	r := fixtures.NewReplay(t, exchanges...)
	url := r.Start()
	return testClient(t, url), r
}

// holdingHandler answers requests whose query has index=<hold> by blocking
// until the client gives up (a blocking query on an unchanged index that
// has not timed out yet); everything else goes to next.
func holdingHandler(next http.Handler, hold func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold(r) {
			<-r.Context().Done()
			return
		}
		next.ServeHTTP(w, r)
	})
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// assertSent checks that a received request is the one an exchange
// recorded: method, path, query (durations compared by value: the Go client
// writes wait=1000ms where the recording has 1s) and body (compared as JSON
// with zero values dropped, since the Go client sends empty fields the
// recorder left out). wantBody overrides the recorded body when given.
func assertSent(t testing.TB, got fixtures.Received, want fixtures.Exchange, wantBody ...any) {
	t.Helper()
	if got.Method != want.Request.Method || got.Path != want.Request.Path {
		t.Errorf("request %s %s, want %s %s (%s)", got.Method, got.Path, want.Request.Method, want.Request.Path, want.Name)
		return
	}
	if g, w := normQuery(got.Query), normQuery(want.Request.Query); !reflect.DeepEqual(g, w) {
		t.Errorf("%s %s: query %v, want %v (%s)", got.Method, got.Path, g, w, want.Name)
	}
	var wb []byte
	if len(wantBody) > 0 {
		switch b := wantBody[0].(type) {
		case []byte:
			wb = b
		case string:
			wb = []byte(b)
		default:
			wb, _ = json.Marshal(b)
		}
	} else {
		wb = want.Request.BodyBytes()
	}
	if !sameBody(got.Body, wb) {
		t.Errorf("%s %s: body\n got  %s\n want %s\n(%s)", got.Method, got.Path, got.Body, wb, want.Name)
	}
}

func normQuery(q map[string][]string) map[string]string {
	out := map[string]string{}
	for k, v := range q {
		s := strings.Join(v, ",")
		if d, err := time.ParseDuration(s); err == nil && isDuration.MatchString(s) {
			s = d.String()
		}
		out[k] = s
	}
	return out
}

var isDuration = regexp.MustCompile(`^[0-9]+(ns|us|ms|s|m|h)$`)

func sameBody(got, want []byte) bool {
	g, w := bytes.TrimSpace(got), bytes.TrimSpace(want)
	if len(g) == 0 || len(w) == 0 {
		return len(g) == len(w)
	}
	var gv, wv any
	if json.Unmarshal(g, &gv) != nil || json.Unmarshal(w, &wv) != nil {
		return bytes.Equal(g, w)
	}
	return reflect.DeepEqual(normJSON(gv), normJSON(wv))
}

func normJSON(v any) any {
	v = pruneZero(v)
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normJSON(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normJSON(e)
		}
	case string:
		if isDuration.MatchString(x) {
			if d, err := time.ParseDuration(x); err == nil {
				return d.String()
			}
		}
	}
	return v
}

// helloRecord is the service the recordings were made with: two revisions,
// 30% to hello-00001 (tagged old) and 70% to the latest, hello-00002.
func helloRecord() Record {
	s := spec.NewService("hello")
	s.Namespace = "default"
	s.Traffic = []spec.TrafficTarget{
		{Revision: "hello-00001", Percent: 30, Tag: "old"},
		{Latest: true, Percent: 70},
	}
	return Record{
		Service:   s,
		Latest:    "hello-00002",
		Revisions: []string{"hello-00001", "hello-00002"},
		UpdatedAt: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC),
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
