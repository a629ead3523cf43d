package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// h2cApp is an h2c app in the test process: "/" answers at once,
// "/hold?gate=g" answers its head and holds the body until
// "/release?gate=g" (any protocol), and every request is recorded with
// the client the sidecar names last in X-Forwarded-For.
type h2cApp struct {
	port     int
	requests atomic.Int64

	mu    sync.Mutex
	gates map[string]chan struct{}
	seen  []*h2cSeen
}

type h2cSeen struct {
	from, method, path string
	xff, fwd           []string
	body               []byte
	whole              bool
	done               atomic.Bool
}

func (a *h2cApp) gate(name string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := a.gates[name]
	if g == nil {
		g = make(chan struct{})
		a.gates[name] = g
	}
	return g
}

// forget drops what the app saw from src: a source address comes round
// again after 62,500 fuzz inputs, and a request of an earlier input that
// its check did not wait for (one the client never completed) may have
// arrived after it.
func (a *h2cApp) forget(src string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rest := a.seen[:0]
	for _, s := range a.seen {
		if s.from != src {
			rest = append(rest, s)
		}
	}
	clear(a.seen[len(rest):])
	a.seen = rest
}

func startH2CApp(t testing.TB) *h2cApp {
	a := &h2cApp{gates: map[string]chan struct{}{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/release" {
			close(a.gate(r.URL.Query().Get("gate")))
			return
		}
		a.requests.Add(1)
		xff := r.Header.Values("X-Forwarded-For")
		from := ""
		if len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			from = strings.TrimSpace(parts[len(parts)-1])
		}
		s := &h2cSeen{from: from, method: r.Method, path: r.URL.Path, xff: xff, fwd: r.Header.Values("Forwarded")}
		a.mu.Lock()
		a.seen = append(a.seen, s)
		a.mu.Unlock()
		defer s.done.Store(true)
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		s.body, s.whole = body, err == nil
		if r.URL.Path == "/hold" {
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			select {
			case <-a.gate(r.URL.Query().Get("gate")):
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	protos.SetHTTP1(true)
	srv.Config.Protocols = &protos
	srv.Start()
	t.Cleanup(srv.Close)
	a.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return a
}

// h2cConfig is a sidecar of an h2c app that is not gRPC.
func h2cConfig(port int) spec.SidecarConfig {
	cfg := config(port)
	cfg.AppProtocol = spec.ProtocolH2C
	return cfg
}

// The hostile HTTP/2 table (test/rawh2) against the relay: the sidecar of
// an h2c app serves its HTTP/2 clients with it.
func TestHostileInputSidecarRelay(t *testing.T) {
	if testing.Short() {
		t.Skip("floods of frames (skipped in -short)")
	}
	a := startH2CApp(t)
	r := startSidecar(t, h2cConfig(a.port), sidecar.Options{})
	r.waitReady(t)
	rawh2.Run(t, &rawh2.Target{
		Addr: strings.TrimPrefix(r.url, "http://"),
		Host: "hello.default.localhost", Path: "/",
		Hold: func(i int) string { return fmt.Sprintf("/hold?gate=h2-%d", i) },
		Release: func(tb testing.TB, n int) {
			for i := range n {
				close(a.gate(fmt.Sprintf("h2-%d", i)))
			}
		},
		AtInstance:     func(tb testing.TB) int64 { return a.requests.Load() },
		MaxStreams:     250,
		MaxHeaderBytes: http.DefaultMaxHeaderBytes,
		// Streams opened and reset at once reach the app (both frames
		// in one write): the sidecar does not close its client's
		// connection for them (see TestHostileInputSidecarH2), and the
		// relay's reset limit (5,000 a second) lets the attack's
		// 10,000 through in two seconds or ends the connection.
		RapidResetReach: rawh2.RapidResets,
		MaxHeapGrowth:   64 << 20,
	}, rawh2.Cases())
}

// FuzzSidecarRelayH2 writes the preface and then arbitrary bytes to the
// sidecar of an h2c app (the relay), and checks, as FuzzGatewayH2 does
// for the gateway: no panic (it would end the process); the connection
// ends or answers every request the bytes complete within a bound; and
// nothing reaches the app that x/net/http2's Framer does not decode as a
// request head from the same bytes (same method and path), with a body
// the app read whole only if the reference decoded it whole, byte for
// byte.
func FuzzSidecarRelayH2(f *testing.F) {
	for _, seed := range relayFuzzSeeds() {
		f.Add(seed)
	}
	a := startH2CApp(f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	cfg := h2cConfig(a.port)
	cfg.Port, cfg.AdminPort = ln.Addr().(*net.TCPAddr).Port, adm.Addr().(*net.TCPAddr).Port
	sc, err := sidecar.New(cfg, sidecar.Options{})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sc.Serve(ctx, ln, adm) }()
	f.Cleanup(func() { cancel(); <-done })
	addr := ln.Addr().String()
	var iter atomic.Uint32
	f.Fuzz(func(t *testing.T, in []byte) {
		n := iter.Add(1)
		src := net.IPv4(127, byte(1+n/250%250), byte(n%250), 3)
		relayFuzzCheck(t, a, addr, src, in)
	})
}

const relayFuzzWithin = 20 * time.Second

func relayFuzzCheck(t *testing.T, a *h2cApp, addr string, src net.IP, in []byte) {
	ref, whole := relayReference(in)
	a.forget(src.String())
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: relayFuzzWithin}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := rawh2.Wrap(t, nc)
	c.NoAck = true
	c.Read()
	ping := [8]byte{'f', 'u', 'z', 'z', '-', 'e', 'n', 'd'}
	out := append([]byte(rawh2.Preface), in...)
	if whole {
		var b bytes.Buffer
		_ = http2.NewFramer(&b, nil).WritePing(false, ping)
		out = append(out, b.Bytes()...)
	}
	_ = c.Write(out)
	o, ok := c.Wait(relayFuzzWithin, func(o *rawh2.Outcome) bool {
		if o.Over() {
			return true
		}
		if whole && !o.PingAcked[ping] {
			return false
		}
		for _, r := range ref {
			if r.complete && !r.reset && o.Statuses[r.stream] == "" && !o.Answered(r.stream) {
				return false
			}
		}
		return true
	})
	c.Close()
	if !ok {
		t.Fatalf("no end and no answer to every complete request within %s: %s", relayFuzzWithin, &o)
	}
	// What reached the app from this client is done with, then matched
	// against the reference.
	var seen []*h2cSeen
	for end := time.Now().Add(relayFuzzWithin); ; time.Sleep(time.Millisecond) {
		seen = seen[:0]
		busy := false
		a.mu.Lock()
		for _, s := range a.seen {
			if s.from == src.String() {
				seen = append(seen, s)
				busy = busy || !s.done.Load()
			}
		}
		a.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("requests at the app still running %s after the client went", relayFuzzWithin)
		}
	}
	used := make([]bool, len(ref))
	for _, s := range seen {
		match := -1
		for i, r := range ref {
			if used[i] || r.method != s.method || r.path != s.path {
				continue
			}
			if s.whole && !(r.complete && bytes.Equal(r.body, s.body)) {
				continue
			}
			match = i
			break
		}
		if match < 0 {
			t.Fatalf("the app got %s %q (body %q, whole %v), which the reference did not decode; it decoded %+v", s.method, s.path, s.body, s.whole, ref)
		}
		used[match] = true
	}
}

// relayRef is a request head the reference decoded, with its body.
type relayRef struct {
	stream       uint32
	method, path string
	body         []byte
	complete     bool
	reset        bool
}

// relayReference decodes in with x/net/http2's Framer until it fails
// (looser limits than the relay's); whole: in ends between frames.
func relayReference(in []byte) (reqs []relayRef, whole bool) {
	fr := http2.NewFramer(io.Discard, bytes.NewReader(in))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 16 << 20
	fr.SetMaxReadFrameSize(1<<24 - 1)
	index := map[uint32]int{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				continue
			}
			pos := 0
			for pos+9 <= len(in) {
				pos += 9 + (int(in[pos])<<16 | int(in[pos+1])<<8 | int(in[pos+2]))
			}
			return reqs, pos == len(in)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			id := f.StreamID
			if i, ok := index[id]; ok {
				reqs[i].complete = reqs[i].complete || f.StreamEnded()
				continue
			}
			if id%2 == 0 {
				continue
			}
			method, path := f.PseudoValue("method"), f.PseudoValue("path")
			u, err := url.ParseRequestURI(path)
			if method == "" || err != nil {
				continue
			}
			index[id] = len(reqs)
			reqs = append(reqs, relayRef{stream: id, method: method, path: u.Path, complete: f.StreamEnded()})
		case *http2.RSTStreamFrame:
			if i, ok := index[f.StreamID]; ok {
				reqs[i].reset = true
			}
		case *http2.DataFrame:
			if i, ok := index[f.StreamID]; ok && !reqs[i].complete {
				reqs[i].body = append(reqs[i].body, f.Data()...)
				reqs[i].complete = f.StreamEnded()
			}
		}
	}
}

// relayFuzzSeeds are frame streams that follow the preface: requests
// with and without bodies, several streams, a split field block,
// trailers, resets, padding, and a few of the hostile table's inputs.
func relayFuzzSeeds() [][]byte {
	type build func(fr *http2.Framer, block func(method, path string, extra ...string) []byte)
	seeds := []build{
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings()
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("GET", "/"), EndHeaders: true, EndStream: true})
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("POST", "/echo", "content-length", "5"), EndHeaders: true})
			fr.WriteData(1, false, []byte("hel"))
			fr.WriteData(1, true, []byte("lo"))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block("GET", "/a/b?x=1"), EndHeaders: true, EndStream: true})
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings()
			b := block("POST", "/grpc", "content-type", "application/grpc", "te", "trailers")
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:4], EndHeaders: false})
			fr.WriteContinuation(1, true, b[4:])
			fr.WriteDataPadded(1, false, []byte{0, 0, 0, 0, 2, 'h', 'i'}, make([]byte, 7))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("", "", "x-trailer", "1"), EndHeaders: true, EndStream: true})
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings()
			for i := range 8 {
				id := uint32(2*i + 1)
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block("GET", "/r/"+strconv.Itoa(i)), EndHeaders: true, EndStream: true})
				fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
			fr.WritePing(false, [8]byte{1})
			fr.WriteWindowUpdate(0, 1000)
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings()
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("POST", "/"), EndHeaders: true})
			fr.WriteData(1, false, []byte("partial body, never ended"))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block("GET", "/"), EndHeaders: true, EndStream: true})
			fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings()
			fr.WriteData(1, true, []byte("data on an idle stream"))
		},
		func(fr *http2.Framer, block func(string, string, ...string) []byte) {
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("GET", "/"), EndHeaders: true, EndStream: true})
			fr.WriteWindowUpdate(1, 1)
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 16})
		},
	}
	var out [][]byte
	for _, s := range seeds {
		var buf, hb bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		enc := hpack.NewEncoder(&hb)
		s(fr, func(method, path string, extra ...string) []byte {
			hb.Reset()
			if method != "" {
				for _, kv := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "hello.default.localhost"}, {":path", path}} {
					enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
				}
			}
			for i := 0; i+1 < len(extra); i += 2 {
				enc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1]})
			}
			return bytes.Clone(hb.Bytes())
		})
		out = append(out, buf.Bytes())
	}
	return out
}
