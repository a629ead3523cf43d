package activator

import (
	"bytes"
	"context"
	"errors"
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

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// FuzzGatewayH2 writes the HTTP/2 preface and then arbitrary bytes to the
// gateway's listener (Server on the screened Listener, as serve runs it),
// an instance behind it, and checks:
//   - no panic (in the gateway's handlers, counted; elsewhere the test
//     process dies);
//   - the connection ends, or answers every request the bytes complete
//     (a response head or a reset), within h2FuzzWithin, and every handler
//     returns once the client has gone;
//   - nothing reaches the instance that x/net/http2's Framer, the
//     reference, does not decode from the same bytes as a request head
//     (same method and path), and a body the instance read to its end is
//     one the reference decoded whole (END_STREAM) for such a request,
//     byte for byte.
//
// make fuzz-http runs it.
func FuzzGatewayH2(f *testing.F) {
	for _, seed := range h2FuzzSeeds() {
		f.Add(seed)
	}
	fx := startH2Fuzz(f)
	var iter atomic.Uint32
	f.Fuzz(func(t *testing.T, in []byte) {
		// Each run's connection comes from its own loopback address: the
		// instance tells this run's requests by the X-Forwarded-For the
		// gateway adds, whatever a late one of an earlier run does.
		n := iter.Add(1)
		src := net.IPv4(127, byte(1+n/250%250), byte(n%250), 2)
		ref, whole := h2Reference(in)
		fx.check(t, src, in, ref, whole)
	})
}

// h2FuzzWithin bounds every wait of a run: longer is a hang.
const h2FuzzWithin = 20 * time.Second

// h2FuzzHost routes to the fuzz instance.
const h2FuzzHost = "hello.default.localhost"

// h2Fuzz is the fuzz target's fixture: one gateway and one instance for
// every run.
type h2Fuzz struct {
	addr   string
	reg    *prometheus.Registry
	active atomic.Int64 // the gateway's handlers running

	mu   sync.Mutex
	seen []*h2Seen // what reached the instance
}

// h2Seen is one request the instance got.
type h2Seen struct {
	from, method, path string
	done               atomic.Bool // its handler returned
	body               []byte
	whole              bool // the body was read to its end
}

func startH2Fuzz(tb testing.TB) *h2Fuzz {
	fx := &h2Fuzz{reg: prometheus.NewRegistry()}
	var inst atomic.Int64
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("K-Network-Probe") != "" {
			io.WriteString(w, "queue")
			return
		}
		inst.Add(1)
		defer inst.Add(-1)
		xff := r.Header.Values("X-Forwarded-For")
		from := ""
		if len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			from = strings.TrimSpace(parts[len(parts)-1])
		}
		s := &h2Seen{from: from, method: r.Method, path: r.URL.Path}
		fx.mu.Lock()
		fx.seen = append(fx.seen, s)
		fx.mu.Unlock()
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		s.body, s.whole = body, err == nil
		s.done.Store(true)
		io.WriteString(w, "ok")
	}))
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	app.Config.Protocols = &protos
	app.Start()
	tb.Cleanup(app.Close)
	port := app.Listener.Addr().(*net.TCPAddr).Port

	cat := oneRevision(0, time.Minute)
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "c-fuzz", Revision: "hello-00001", Address: "127.0.0.1", Port: port}})
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}, Registerer: fx.reg, MaxBodyBytes: 1 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := g.Server("")
	h := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.active.Add(1)
		defer fx.active.Add(-1)
		h.ServeHTTP(w, r)
	})
	go func() { _ = srv.Serve(g.Listener(ln)) }()
	tb.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
	})
	fx.addr = ln.Addr().String()
	for end := time.Now().Add(h2FuzzWithin); len(g.routable("hello-00001")) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			tb.Fatal("the instance did not become routable")
		}
	}
	return fx
}

// h2FuzzPing follows an input that ends between frames: its ACK says
// the server read all of the input.
var h2FuzzPing = [8]byte{'f', 'u', 'z', 'z', '-', 'e', 'n', 'd'}

// check runs one input from src against what the reference decoded; whole:
// the input ends between frames.
func (fx *h2Fuzz) check(t *testing.T, src net.IP, in []byte, ref []h2RefRequest, whole bool) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: h2FuzzWithin}
	nc, err := d.Dial("tcp", fx.addr)
	if err != nil {
		t.Fatal(err)
	}
	c := rawh2.Wrap(t, nc)
	c.NoAck = true // the client sends the input and nothing else
	c.Read()
	out := append([]byte(rawh2.Preface), in...)
	if whole {
		// A PING after the input: the server answers it (or ends the
		// connection) once it has read everything before it. After a cut
		// frame the server waits for the rest, rightly.
		var b bytes.Buffer
		_ = http2.NewFramer(&b, nil).WritePing(false, h2FuzzPing)
		out = append(out, b.Bytes()...)
	}
	_ = c.Write(out)
	o, ok := c.Wait(h2FuzzWithin, func(o *rawh2.Outcome) bool {
		if o.Over() {
			return true
		}
		if whole && !o.PingAcked[h2FuzzPing] {
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
		t.Fatalf("no end and no answer to every complete request within %s: %s", h2FuzzWithin, &o)
	}
	// Every handler returns once the client has gone, and every request
	// that reached the instance is done with.
	for end := time.Now().Add(h2FuzzWithin); ; time.Sleep(time.Millisecond) {
		if fx.active.Load() == 0 && fx.instanceDone(src.String()) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d gateway handlers still running %s after the client went", fx.active.Load(), h2FuzzWithin)
		}
	}
	if p := h2Panics(t, fx.reg); p != 0 {
		t.Fatalf("%v panics in the gateway's handlers", p)
	}

	fx.mu.Lock()
	var seen []*h2Seen
	rest := fx.seen[:0]
	for _, s := range fx.seen {
		switch {
		case !s.done.Load():
			// Late: a request whose gateway handler gave up on it before
			// the instance's started (its cancellation is on the way).
			// Its body is still being read; it is left out.
			rest = append(rest, s)
		case s.from == src.String():
			seen = append(seen, s)
		}
	}
	fx.seen = rest
	fx.mu.Unlock()

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
			t.Fatalf("the instance got %s %q (body %q, whole %v), which the reference did not decode; it decoded %+v", s.method, s.path, s.body, s.whole, ref)
		}
		used[match] = true
	}
	if testing.Verbose() {
		t.Logf("the reference decoded %d requests, the instance got %d; the server sent %s", len(ref), len(seen), &o)
	}
}

// instanceDone reports whether every request from src the instance got
// is done with.
func (fx *h2Fuzz) instanceDone(src string) bool {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	for _, s := range fx.seen {
		if s.from == src && !s.done.Load() {
			return false
		}
	}
	return true
}

func h2Panics(t *testing.T, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == gwNS+"_panics_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// h2RefRequest is a request head the reference decoded, with the body it
// decoded for it.
type h2RefRequest struct {
	stream       uint32
	method, path string // path: the URL path net/http makes of :path
	body         []byte
	complete     bool // END_STREAM came
	reset        bool // the client reset it: the server need not answer
}

// h2Reference decodes in (what follows the preface) with x/net/http2's
// Framer until it fails: every request head (the first complete field
// block of an odd stream, with :method and a :path net/http parses), its
// DATA, whether END_STREAM came and whether the client reset it. Its
// limits are looser than the gateway's, so it decodes what the gateway
// would and more. whole: in ends between two frames, all read.
func h2Reference(in []byte) (reqs []h2RefRequest, whole bool) {
	fr := http2.NewFramer(io.Discard, bytes.NewReader(in))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 16 << 20
	fr.SetMaxReadFrameSize(1<<24 - 1)
	var out []h2RefRequest
	index := map[uint32]int{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				continue // that stream is refused; the connection goes on
			}
			return out, frameBoundary(in)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			id := f.StreamID
			if i, ok := index[id]; ok {
				// Trailers: the body ends here.
				out[i].complete = out[i].complete || f.StreamEnded()
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
			index[id] = len(out)
			out = append(out, h2RefRequest{stream: id, method: method, path: u.Path, complete: f.StreamEnded()})
		case *http2.RSTStreamFrame:
			if i, ok := index[f.StreamID]; ok {
				out[i].reset = true
			}
		case *http2.DataFrame:
			if i, ok := index[f.StreamID]; ok && !out[i].complete {
				out[i].body = append(out[i].body, f.Data()...)
				out[i].complete = f.StreamEnded()
			}
		}
	}
}

// frameBoundary reports whether in ends where a frame ends, by the
// lengths in the frame headers.
func frameBoundary(in []byte) bool {
	pos := 0
	for pos+9 <= len(in) {
		pos += 9 + (int(in[pos])<<16 | int(in[pos+1])<<8 | int(in[pos+2]))
	}
	return pos == len(in)
}

// h2FuzzSeeds are frame streams that follow the preface: requests with
// and without bodies, several streams, a split field block, trailers,
// resets, padding, and a few of the hostile table's inputs.
func h2FuzzSeeds() [][]byte {
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
			fr.WriteSettings()
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("GET", "/"), EndHeaders: false, EndStream: true})
			fr.WritePing(false, [8]byte{})
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
				for _, kv := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", h2FuzzHost}, {":path", path}} {
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
