package autoscaler

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/nomad-serverless/nomad-serverless/adminauth"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// testKeys is a keyring of one fresh key, as every replica of one cluster
// reads it from Consul.
func testKeys(t *testing.T) *adminauth.Ring {
	t.Helper()
	k, err := adminauth.NewKey(time.Now(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	kr, err := adminauth.NewKeyring([]adminauth.Key{k})
	if err != nil {
		t.Fatal(err)
	}
	r := &adminauth.Ring{}
	r.Set(kr)
	return r
}

// signedClient signs with keys, as serve's client for RemoteSink does.
func signedClient(t *testing.T, keys adminauth.KeySource) *http.Client {
	t.Helper()
	tr, err := adminauth.NewTransport(adminauth.TransportConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// adminServer serves a's admin API on 127.0.0.1, its writes verified
// against keys.
func adminServer(t *testing.T, a *Autoscaler, keys adminauth.KeySource) *httptest.Server {
	t.Helper()
	v, err := adminauth.NewVerifier(adminauth.VerifierConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	if err := RegisterAdmin(e, a, v); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func post(t *testing.T, c *http.Client, url, body string) (int, string) {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e adminError
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error
}

func TestAdminAPI(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 1, nil))
	cat.SetRevision(testRevision("other-00001", 0, nil))
	cat.SetReady("hello-00001", instances("hello-00001", 1))
	scr.set("hello-00001-i0", 12)
	keys := testKeys(t)
	srv := adminServer(t, a, keys)
	c := signedClient(t, keys)

	// Not leading: every endpoint says so, with 503.
	if code := getJSON(t, srv.URL+PathRevisions, nil); code != http.StatusServiceUnavailable {
		t.Fatalf("GET revisions while not leading: %d, want 503", code)
	}
	if code, msg := post(t, c, srv.URL+PathWake, `{"replica":"a1","demand":{"revision":"other-00001","queued":1}}`); code != http.StatusServiceUnavailable || !strings.Contains(msg, "not the leader") {
		t.Fatalf("POST wake while not leading: %d %q, want 503 not the leader", code, msg)
	}

	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 2*time.Second)

	var states []RevisionState
	if code := getJSON(t, srv.URL+PathRevisions, &states); code != http.StatusOK || len(states) != 2 {
		t.Fatalf("GET revisions: %d %+v", code, states)
	}
	h := states[0]
	if h.Revision != "hello-00001" || h.Service != "hello" || h.Stable != 12 || h.Actual != 1 ||
		h.Reason != "stable: 12.0 concurrent over 70.0 target per instance" || h.Rule != RuleStable {
		t.Fatalf("hello state over the API: %+v", h)
	}
	var raw []map[string]any
	getJSON(t, srv.URL+PathRevisions+"?service=other", &raw)
	if len(raw) != 1 || raw[0]["revision"] != "other-00001" || raw[0]["rule"] != "zero" || raw[0]["panic_mode"] != false {
		t.Fatalf("GET revisions?service=other: %v", raw)
	}

	var bc BurstCapacities
	if code := getJSON(t, srv.URL+PathBurstCapacity, &bc); code != http.StatusOK || bc.Revisions["hello-00001"] != -123 || bc.Revisions["other-00001"] != -211 {
		t.Fatalf("GET burst-capacity: %d %+v", code, bc)
	}

	if code, _ := post(t, c, srv.URL+PathDemand, `{"replica":"a2","demand":[{"revision":"other-00001","queued":4,"in_flight":0}]}`); code != http.StatusNoContent {
		t.Fatalf("POST demand: %d", code)
	}
	for _, bad := range []string{`{"replica":"","demand":[]}`, `not json`, `{"replica":"a2","demand":[{"revision":""}]}`, `{"replica":"a2","bogus":1}`} {
		if code, msg := post(t, c, srv.URL+PathDemand, bad); code != http.StatusBadRequest || msg == "" {
			t.Errorf("POST demand %s: %d %q, want 400 with a message", bad, code, msg)
		}
	}
	if code, _ := post(t, c, srv.URL+PathWake, `{"replica":"a2","demand":{"revision":"other-00001","queued":4}}`); code != http.StatusNoContent {
		t.Fatalf("POST wake: %d", code)
	}
	// The loop is driven by hand here: the wake is pending for it.
	l.tickWoken(ctx)
	l.applies.Wait()
	var woke bool
	for _, c := range sc.Calls() {
		if c.Revision == "other-00001" && c.Count == 1 && strings.HasPrefix(c.Reason, "wake: 4 requests") {
			woke = true
		}
	}
	if !woke {
		t.Fatalf("the wake over the API scaled nothing: %+v", sc.Calls())
	}
}

func TestRemoteSink(t *testing.T) {
	ctx := context.Background()
	a, cat, _, _, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	keys := testKeys(t)
	srv := adminServer(t, a, keys)
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 0)

	var leaderAddr atomic.Value
	leaderAddr.Store(strings.TrimPrefix(srv.URL, "http://"))
	now := newClock()
	rs, err := NewRemoteSink(RemoteSinkConfig{
		Leader: func() (string, bool) { s := leaderAddr.Load().(string); return s, s != "" },
		Client: signedClient(t, keys),
		Poll:   time.Second,
		Now:    now.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rs.ExcessBurstCapacity("hello-00001"); ok {
		t.Fatal("known before the first poll")
	}
	if err := rs.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if ebc, ok := rs.ExcessBurstCapacity("hello-00001"); !ok || ebc != -211 {
		t.Fatalf("ebc %v %v, want -211 from the leader", ebc, ok)
	}
	if _, ok := rs.ExcessBurstCapacity("nope-00001"); ok {
		t.Fatal("an unknown revision reads as known")
	}
	allocs := testing.AllocsPerRun(1000, func() { rs.ExcessBurstCapacity("hello-00001") })
	if allocs != 0 {
		t.Errorf("RemoteSink.ExcessBurstCapacity allocates %v times, want 0", allocs)
	}
	// Stale after 3 polls without an answer.
	now.Advance(3*time.Second + time.Millisecond)
	if _, ok := rs.ExcessBurstCapacity("hello-00001"); ok {
		t.Fatal("a stale burst capacity reads as known")
	}

	// Demand and wakes reach the leader.
	if err := rs.ReportDemand(ctx, "a9", []Demand{{Revision: "hello-00001", Queued: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := rs.Wake(ctx, "a9", Demand{Revision: "hello-00001", Queued: 3}); err != nil {
		t.Fatal(err)
	}
	a.demandMu.Lock()
	got := a.reports["a9"].demand["hello-00001"].Queued
	a.demandMu.Unlock()
	if got != 3 {
		t.Fatalf("leader holds queued %d from the remote replica, want 3", got)
	}

	// No leader known, or a replica that does not lead: clear errors.
	leaderAddr.Store("")
	if err := rs.Wake(ctx, "a9", Demand{Revision: "hello-00001", Queued: 1}); err == nil || !strings.Contains(err.Error(), "no autoscaler leader") {
		t.Fatalf("Wake without a leader: %v", err)
	}
	b, _, _, _, _ := newTestAutoscaler(t, nil)
	leaderAddr.Store(adminServer(t, b, keys).URL)
	if err := rs.Wake(ctx, "a9", Demand{Revision: "hello-00001", Queued: 1}); err == nil || !strings.Contains(err.Error(), "not the leader") {
		t.Fatalf("Wake at a replica that does not lead: %v", err)
	}
	if err := rs.refresh(ctx); err == nil {
		t.Fatal("refresh from a replica that does not lead: no error")
	}
}

func TestRemoteSinkPrefersLocalLeader(t *testing.T) {
	ctx := context.Background()
	a, cat, _, _, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	rs, err := NewRemoteSink(RemoteSinkConfig{
		Leader: func() (string, bool) { return "127.0.0.1:1", true }, // nothing listens
		Local:  a,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Wake(ctx, "a1", Demand{Revision: "hello-00001", Queued: 1}); err == nil {
		t.Fatal("Wake with neither a local leader nor a reachable one: no error")
	}
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 0)
	if err := rs.Wake(ctx, "a1", Demand{Revision: "hello-00001", Queued: 1}); err != nil {
		t.Fatalf("Wake through the local leader: %v", err)
	}
	if ebc, ok := rs.ExcessBurstCapacity("hello-00001"); !ok || ebc != -211 {
		t.Fatalf("ebc through the local leader: %v %v", ebc, ok)
	}
}

func TestRemoteSinkRunPollsUntilCancelled(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != PathBurstCapacity {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		json.NewEncoder(w).Encode(BurstCapacities{Revisions: map[string]float64{"hello-00001": 5}})
	}))
	t.Cleanup(srv.Close)
	// Stale generous: with 3 polls (30 ms) a loaded machine saw the
	// snapshot expire between the third poll and the read below.
	rs, err := NewRemoteSink(RemoteSinkConfig{Leader: func() (string, bool) { return srv.URL, true }, Poll: 10 * time.Millisecond, Stale: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rs.Run(ctx) }()
	waitFor(t, 20*time.Second, "three polls", func() bool { return hits.Load() >= 3 })
	if ebc, ok := rs.ExcessBurstCapacity("hello-00001"); !ok || ebc != 5 {
		t.Fatalf("ebc %v %v, want 5", ebc, ok)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testbin.Bound(20 * time.Second)):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := NewRemoteSink(RemoteSinkConfig{}); err == nil || errors.Is(err, ErrNotLeader) {
		t.Fatalf("NewRemoteSink without Leader: %v", err)
	}
}

func TestRemoteSinkCoalescesWakes(t *testing.T) {
	var posts atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	rs, err := NewRemoteSink(RemoteSinkConfig{Leader: func() (string, bool) { return srv.URL, true }})
	if err != nil {
		t.Fatal(err)
	}
	var returned atomic.Int64
	errs := make(chan error, 200)
	for i := range 200 {
		go func() {
			errs <- rs.Wake(context.Background(), "a1", Demand{Revision: "hello-00001", Queued: i + 1})
			returned.Add(1)
		}()
	}
	// All but the one in flight return at once.
	waitFor(t, 20*time.Second, "199 coalesced wakes", func() bool { return returned.Load() == 199 })
	close(release)
	for range 200 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("%d wake POSTs for a burst of 200, want 1", n)
	}
}

// recordingHandler keeps the messages of the records logged at Warn.
type recordingHandler struct {
	mu    sync.Mutex
	warns []string
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.mu.Lock()
		h.warns = append(h.warns, r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.warns)
}

// While the replicas elect a leader (a few seconds after start) a replica
// knows none; that is not worth a warning until it lasts
// leaderlessWarnAfter, and then it is worth exactly one.
func TestRemoteSinkWarnsOnlyWhenNoLeaderLasts(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	h := &recordingHandler{}
	rs, err := NewRemoteSink(RemoteSinkConfig{
		Leader: func() (string, bool) { return "", false },
		Poll:   5 * time.Millisecond, Now: clock, Logger: slog.New(h),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rs.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Polls for "29 s" of the sink's clock: no warning.
	for range 29 {
		advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	if w := h.warnings(); len(w) != 0 {
		t.Fatalf("warned while a leader was being elected: %q", w)
	}
	// Past 30 s: one warning, however long it goes on.
	deadline := time.Now().Add(5 * time.Second)
	for len(h.warnings()) == 0 && time.Now().Before(deadline) {
		advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	for range 20 {
		advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	if w := h.warnings(); len(w) != 1 || !strings.Contains(w[0], "no autoscaler leader") {
		t.Fatalf("warnings after a minute without a leader: %q, want one about the missing leader", w)
	}
}

// The demand and wake endpoints obey only signed requests: anything else is
// refused with 401 before the autoscaler hears of it, so the count Nomad
// is given does not move. Reads stay open for `nomad-serverless status`.
func TestAdminWritesNeedASignature(t *testing.T) {
	ctx := context.Background()
	a, cat, _, sc, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	keys := testKeys(t)
	srv := adminServer(t, a, keys)
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 0)
	callsBefore := len(sc.Calls())

	wake := `{"replica":"intruder","demand":{"revision":"hello-00001","queued":1000}}`
	demand := `{"replica":"intruder","demand":[{"revision":"hello-00001","queued":1000}]}`
	otherCluster := signedClient(t, testKeys(t))
	for _, c := range []struct {
		name   string
		client *http.Client
	}{{"unsigned", http.DefaultClient}, {"signed with another key", otherCluster}} {
		for path, body := range map[string]string{PathWake: wake, PathDemand: demand} {
			if code, msg := post(t, c.client, srv.URL+path, body); code != http.StatusUnauthorized || msg == "" {
				t.Errorf("%s POST %s: %d %q, want 401 with a reason", c.name, path, code, msg)
			}
		}
	}
	a.demandMu.Lock()
	_, heard := a.reports["intruder"]
	a.demandMu.Unlock()
	if heard {
		t.Fatal("a refused request reached the autoscaler's demand")
	}
	a.wakeMu.Lock()
	pending := len(a.wakes)
	a.wakeMu.Unlock()
	if pending != 0 {
		t.Fatalf("a refused wake is pending: %d", pending)
	}
	tickN(ctx, l, clk, 3, 2*time.Second)
	if calls := sc.Calls()[callsBefore:]; len(calls) != 0 {
		t.Fatalf("refused requests led to scale calls: %+v", calls)
	}

	// Reads need no signature.
	var states []RevisionState
	if code := getJSON(t, srv.URL+PathRevisions, &states); code != http.StatusOK || len(states) != 1 || states[0].Actual != 0 {
		t.Fatalf("unsigned GET revisions: %d %+v", code, states)
	}
	var bc BurstCapacities
	if code := getJSON(t, srv.URL+PathBurstCapacity, &bc); code != http.StatusOK {
		t.Fatalf("unsigned GET burst-capacity: %d", code)
	}

	// A RemoteSink holding another cluster's key is refused, and says so.
	rs, err := NewRemoteSink(RemoteSinkConfig{Leader: func() (string, bool) { return srv.URL, true }, Client: otherCluster})
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Wake(ctx, "a9", Demand{Revision: "hello-00001", Queued: 1}); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "keyring") {
		t.Fatalf("Wake signed with a foreign key: %v, want a 401 naming the keyring", err)
	}
	tickN(ctx, l, clk, 1, 2*time.Second)
	if calls := sc.Calls()[callsBefore:]; len(calls) != 0 {
		t.Fatalf("a refused RemoteSink wake led to scale calls: %+v", calls)
	}

	// The same wake, signed with the cluster's key, wakes.
	if code, msg := post(t, signedClient(t, keys), srv.URL+PathWake, wake); code != http.StatusNoContent {
		t.Fatalf("signed wake: %d %q", code, msg)
	}
	l.tickWoken(ctx)
	l.applies.Wait()
	if calls := sc.Calls()[callsBefore:]; len(calls) != 1 || calls[0].Count < 1 {
		t.Fatalf("signed wake: scale calls %+v, want one up from zero", calls)
	}
}

func TestRegisterAdminNeedsAGuard(t *testing.T) {
	a, _, _, _, _ := newTestAutoscaler(t, nil)
	if err := RegisterAdmin(echo.New(), a, nil); err == nil || !strings.Contains(err.Error(), "guard") {
		t.Fatalf("RegisterAdmin without a guard: %v", err)
	}
}
