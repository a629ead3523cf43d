package adminauth

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testKey(t *testing.T, id string, notBefore time.Time) Key {
	t.Helper()
	k, err := NewKey(time.Now(), notBefore)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		k.ID = id
	}
	return k
}

func testRing(t *testing.T, keys ...Key) *Ring {
	t.Helper()
	kr, err := NewKeyring(keys)
	if err != nil {
		t.Fatal(err)
	}
	r := &Ring{}
	r.Set(kr)
	return r
}

// clock is a settable clock for the verifier and signer.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// server is a verifier in front of a handler that counts what reaches it
// and keeps the last body it read.
type server struct {
	*httptest.Server
	v       *Verifier
	reg     *prometheus.Registry
	reached atomic.Int64
	mu      sync.Mutex
	body    string
}

func newServer(t *testing.T, keys KeySource, cfg VerifierConfig) *server {
	t.Helper()
	s := &server{reg: prometheus.NewRegistry()}
	cfg.Keys, cfg.Registerer = keys, s.reg
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.v = v
	s.Server = httptest.NewServer(v.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.body = string(b)
		s.mu.Unlock()
		s.reached.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})))
	t.Cleanup(s.Close)
	return s
}

func (s *server) count(result string) float64 {
	return testutil.ToFloat64(s.v.results.WithLabelValues(result))
}

// recorder keeps the last request a Transport signed, to replay or tamper
// with it.
type recorder struct {
	base   http.RoundTripper
	header http.Header
	body   []byte
	url    string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.header = req.Header.Clone()
	r.url = req.URL.String()
	r.body = nil
	if req.Body != nil {
		r.body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(r.body))
	}
	return r.base.RoundTrip(req)
}

func signedClient(t *testing.T, keys KeySource, now func() time.Time, base http.RoundTripper) *http.Client {
	t.Helper()
	tr, err := NewTransport(TransportConfig{Keys: keys, Now: now, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func do(t *testing.T, c *http.Client, method, url string, header http.Header, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e errorBody
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") != Scheme {
		t.Errorf("401 without WWW-Authenticate: %s", Scheme)
	}
	return resp.StatusCode, e.Error
}

func TestSignedRequestReachesTheHandler(t *testing.T) {
	ring := testRing(t, testKey(t, "k1", time.Time{}))
	s := newServer(t, ring, VerifierConfig{})
	c := signedClient(t, ring, nil, nil)
	body := `{"replica":"a1","demand":{"revision":"hello-00001","queued":3}}`
	if code, msg := do(t, c, http.MethodPost, s.URL+"/v1/autoscaler/wake?x=1", nil, body); code != http.StatusNoContent {
		t.Fatalf("signed POST: %d %q", code, msg)
	}
	if s.body != body {
		t.Fatalf("the handler read %q, want the signed body %q", s.body, body)
	}
	// A GET without a body, and an empty POST, sign too.
	if code, msg := do(t, c, http.MethodGet, s.URL+"/v1/autoscaler/revisions", nil, ""); code != http.StatusNoContent {
		t.Fatalf("signed GET: %d %q", code, msg)
	}
	if code, msg := do(t, c, http.MethodPost, s.URL+"/x", nil, ""); code != http.StatusNoContent {
		t.Fatalf("signed empty POST: %d %q", code, msg)
	}
	if got := s.count("accepted"); got != 3 {
		t.Fatalf("accepted %v, want 3", got)
	}
}

func TestRefusedRequestsNeverReachTheHandler(t *testing.T) {
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	k1 := testKey(t, "k1", time.Time{})
	ring := testRing(t, k1)
	s := newServer(t, ring, VerifierConfig{Now: clk.Now, Window: 30 * time.Second})
	plain := &http.Client{Timeout: 5 * time.Second}
	body := `{"replica":"a1","demand":{"revision":"hello-00001","queued":3}}`

	// One good signed request, recorded, for tampering and replay.
	rec := &recorder{base: http.DefaultTransport}
	if code, msg := do(t, signedClient(t, ring, clk.Now, rec), http.MethodPost, s.URL+"/v1/autoscaler/wake", nil, body); code != http.StatusNoContent {
		t.Fatalf("signed POST: %d %q", code, msg)
	}
	good := rec.header.Get("Authorization")
	withAuth := func(a string) http.Header { return http.Header{"Authorization": {a}} }
	replace := func(from, to string) http.Header { return withAuth(strings.Replace(good, from, to, 1)) }
	param := func(name string) string {
		_, rest, _ := strings.Cut(good, name+"=")
		v, _, _ := strings.Cut(rest, ",")
		return v
	}

	wrongSecret := testKey(t, "k1", time.Time{}) // same ID, another secret
	other := testKey(t, "k9", time.Time{})
	signedAt := func(d time.Duration) *http.Client {
		return signedClient(t, ring, func() time.Time { return clk.Now().Add(d) }, nil)
	}
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
		header http.Header
		body   string
		status int
		result string
	}{
		{"no header", plain, "/v1/autoscaler/wake", nil, body, 401, "missing"},
		{"bearer token", plain, "/v1/autoscaler/wake", withAuth("Bearer abc"), body, 401, "scheme"},
		{"scheme only", plain, "/v1/autoscaler/wake", withAuth(Scheme), body, 401, "malformed"},
		{"no signature", plain, "/v1/autoscaler/wake", replace(",sig="+param("sig"), ""), body, 401, "malformed"},
		{"short signature", plain, "/v1/autoscaler/wake", replace("sig="+param("sig"), "sig=AAAA"), body, 401, "malformed"},
		{"short nonce", plain, "/v1/autoscaler/wake", replace("nonce="+param("nonce"), "nonce=AAAA"), body, 401, "malformed"},
		{"two keys", plain, "/v1/autoscaler/wake", replace("key=k1", "key=k1,key=k1"), body, 401, "malformed"},
		{"unknown parameter", plain, "/v1/autoscaler/wake", replace("key=k1", "key=k1,extra=1"), body, 401, "malformed"},
		{"ten minutes old", signedAt(-10 * time.Minute), "/v1/autoscaler/wake", nil, body, 401, "stale"},
		{"from the future", signedAt(31 * time.Second), "/v1/autoscaler/wake", nil, body, 401, "stale"},
		{"unknown key", signedClient(t, testRing(t, other), clk.Now, nil), "/v1/autoscaler/wake", nil, body, 401, "unknown_key"},
		{"wrong secret", signedClient(t, testRing(t, wrongSecret), clk.Now, nil), "/v1/autoscaler/wake", nil, body, 401, "bad_signature"},
		{"body changed", plain, "/v1/autoscaler/wake", withAuth(good), strings.Replace(body, `"queued":3`, `"queued":300`, 1), 401, "bad_signature"},
		{"path changed", plain, "/v1/autoscaler/demand", withAuth(good), body, 401, "bad_signature"},
		{"query added", plain, "/v1/autoscaler/wake?all=1", withAuth(good), body, 401, "bad_signature"},
		{"timestamp changed", plain, "/v1/autoscaler/wake", replace("ts="+param("ts"), "ts=1700000001"), body, 401, "bad_signature"},
		{"body too large", plain, "/v1/autoscaler/wake", withAuth(good), strings.Repeat("x", DefaultMaxBody+1), 413, "too_large"},
		{"replayed", plain, "/v1/autoscaler/wake", withAuth(good), body, 401, "replayed"},
		{"too large", signedAt(0), "/v1/autoscaler/wake", nil, strings.Repeat("x", DefaultMaxBody+1), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.reached.Load()
			if tc.status == 0 {
				// The signer itself refuses to sign an oversized body.
				req, _ := http.NewRequest(http.MethodPost, s.URL+tc.url, strings.NewReader(tc.body))
				if _, err := tc.client.Do(req); err == nil || !strings.Contains(err.Error(), "larger than") {
					t.Fatalf("signing a %d-byte body: %v", len(tc.body), err)
				}
				return
			}
			n := s.count(tc.result)
			code, msg := do(t, tc.client, http.MethodPost, s.URL+tc.url, tc.header, tc.body)
			if code != tc.status || msg == "" {
				t.Fatalf("%d %q, want %d with a reason", code, msg, tc.status)
			}
			if s.reached.Load() != before {
				t.Fatal("the handler ran for a refused request")
			}
			if s.count(tc.result) != n+1 {
				t.Errorf("result %q counted %v times, want %v", tc.result, s.count(tc.result), n+1)
			}
		})
	}

	// A request signed for another replica (captured on its way there,
	// played here) is refused: the host is signed.
	rec2 := &recorder{base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	})}
	req, _ := http.NewRequest(http.MethodPost, "http://10.0.0.9:4647/v1/autoscaler/wake", strings.NewReader(body))
	resp, err := signedClient(t, ring, clk.Now, rec2).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	before := s.reached.Load()
	if code, _ := do(t, plain, http.MethodPost, s.URL+"/v1/autoscaler/wake", withAuth(rec2.header.Get("Authorization")), body); code != 401 || s.count("bad_signature") == 0 {
		t.Fatalf("request signed for another host: %d, want 401 bad_signature", code)
	}
	if s.reached.Load() != before {
		t.Fatal("the handler ran for a request signed for another host")
	}

	// Once the window has passed, the recorded request is stale, and its
	// nonce is forgotten (the cache stays bounded).
	clk.Advance(2 * time.Minute)
	if code, _ := do(t, plain, http.MethodPost, s.URL+"/v1/autoscaler/wake", withAuth(good), body); code != 401 {
		t.Fatalf("replay after the window: %d", code)
	}
	if code, _ := do(t, signedAt(0), http.MethodPost, s.URL+"/v1/autoscaler/wake", nil, body); code != http.StatusNoContent {
		t.Fatalf("fresh signed request after the window: %d", code)
	}
	s.v.mu.Lock()
	n := len(s.v.seen)
	s.v.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d nonces remembered after the window, want only the newest", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestVerifierWithoutKeyOrRoom(t *testing.T) {
	k1 := testKey(t, "k1", time.Time{})
	ring := testRing(t, k1)
	empty := &Ring{}
	s := newServer(t, empty, VerifierConfig{})
	if code, msg := do(t, signedClient(t, ring, nil, nil), http.MethodPost, s.URL+"/w", nil, "{}"); code != http.StatusServiceUnavailable || !strings.Contains(msg, "no admin API key") {
		t.Fatalf("verifier without a keyring: %d %q, want 503", code, msg)
	}
	// A signer without a keyring does not send anything.
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/w", strings.NewReader("{}"))
	if _, err := signedClient(t, empty, nil, nil).Do(req); !errors.Is(err, ErrNoKey) {
		t.Fatalf("signer without a keyring: %v, want ErrNoKey", err)
	}

	full := newServer(t, ring, VerifierConfig{MaxNonces: 1})
	c := signedClient(t, ring, nil, nil)
	if code, _ := do(t, c, http.MethodPost, full.URL+"/w", nil, "{}"); code != http.StatusNoContent {
		t.Fatalf("first signed request: %d", code)
	}
	if code, msg := do(t, c, http.MethodPost, full.URL+"/w", nil, "{}"); code != http.StatusServiceUnavailable || full.reached.Load() != 1 {
		t.Fatalf("request past MaxNonces: %d %q, want 503 and not handled", code, msg)
	}
}

// A rotation: the new key is accepted at once and used for signing only
// from its NotBefore, so replicas that read it a little later than others
// never refuse each other.
func TestRotation(t *testing.T) {
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	old := testKey(t, "old", time.Time{})
	next := testKey(t, "next", clk.Now().Add(10*time.Second))
	rotated := testRing(t, next, old)
	notYet := testRing(t, old)

	lagging := newServer(t, notYet, VerifierConfig{Now: clk.Now})
	c := signedClient(t, rotated, clk.Now, nil)
	if code, msg := do(t, c, http.MethodPost, lagging.URL+"/w", nil, "{}"); code != http.StatusNoContent {
		t.Fatalf("before NotBefore, a rotated replica signs with the old key: %d %q", code, msg)
	}
	clk.Advance(10 * time.Second)
	if code, _ := do(t, c, http.MethodPost, lagging.URL+"/w", nil, "{}"); code != http.StatusUnauthorized {
		t.Fatalf("after NotBefore the new key signs; a replica without it refuses: %d", code)
	}
	current := newServer(t, rotated, VerifierConfig{Now: clk.Now})
	for _, signer := range []*Ring{rotated, notYet} {
		if code, msg := do(t, signedClient(t, signer, clk.Now, nil), http.MethodPost, current.URL+"/w", nil, "{}"); code != http.StatusNoContent {
			t.Fatalf("a rotated verifier accepts old and new keys: %d %q", code, msg)
		}
	}
	if k := rotated.Keyring().Signing(clk.Now()); k.ID != "next" {
		t.Fatalf("signing key %s after NotBefore, want next", k.ID)
	}
	future := testRing(t, testKey(t, "f1", clk.Now().Add(time.Hour)), testKey(t, "f2", clk.Now().Add(2*time.Hour)))
	if k := future.Keyring().Signing(clk.Now()); k.ID != "f1" {
		t.Fatalf("only future keys: signs with %s, want the oldest, f1", k.ID)
	}
}

func TestTransportLeavesTheRequestAlone(t *testing.T) {
	ring := testRing(t, testKey(t, "k1", time.Time{}))
	var seen http.Header
	c := signedClient(t, ring, nil, roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = r.Header.Clone()
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	}))
	req, _ := http.NewRequest(http.MethodPost, "http://10.0.0.1:4647/v1/autoscaler/demand", strings.NewReader("{}"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.Header.Get("Authorization") != "" {
		t.Fatal("the caller's request was changed")
	}
	if !strings.HasPrefix(seen.Get("Authorization"), Scheme+" key=k1,ts=") {
		t.Fatalf("signed header %q", seen.Get("Authorization"))
	}
}

func TestConstructorsValidate(t *testing.T) {
	good := testKey(t, "k1", time.Time{})
	for _, keys := range [][]Key{
		nil,
		{{ID: "", Secret: good.Secret}},
		{{ID: "a b", Secret: good.Secret}},
		{{ID: "k,1", Secret: good.Secret}},
		{{ID: "k1", Secret: good.Secret[:31]}},
		{good, good},
	} {
		if _, err := NewKeyring(keys); err == nil {
			t.Errorf("NewKeyring(%+v) accepted", keys)
		}
	}
	if _, err := NewVerifier(VerifierConfig{}); err == nil {
		t.Error("NewVerifier without Keys accepted")
	}
	if _, err := NewVerifier(VerifierConfig{Keys: &Ring{}, Window: time.Millisecond}); err == nil {
		t.Error("NewVerifier with a sub-second window accepted")
	}
	if _, err := NewVerifier(VerifierConfig{Keys: &Ring{}, MaxNonces: -1}); err == nil {
		t.Error("NewVerifier with negative MaxNonces accepted")
	}
	if _, err := NewTransport(TransportConfig{}); err == nil {
		t.Error("NewTransport without Keys accepted")
	}
	a, _ := NewKey(time.Now(), time.Time{})
	b, _ := NewKey(time.Now(), time.Time{})
	if a.ID == b.ID || bytes.Equal(a.Secret, b.Secret) || len(a.Secret) != MinSecretLen {
		t.Fatalf("NewKey made %+v and %+v", a, b)
	}
}
