package h2relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Decision is what a Handler decides for a new stream (Handler.Request).
type Decision uint8

const (
	// Proceed: open the stream upstream now.
	Proceed Decision = iota
	// Hold: the handler calls Stream.Grant later (a slot freed) from
	// another goroutine; until then the stream waits and what its client
	// sends is held within the stream's receive window.
	Hold
	// Answered: the handler answered the stream itself (Stream.Respond).
	Answered
)

// Handler is the relay's user: it admits each stream, may answer it
// itself, and accounts for it. The relay calls Request, Response, Timer
// and Failed with the stream's session locked (they must not block and
// must not call Grant); Done after the lock is released.
type Handler interface {
	// Request is a new stream with its request head (Stream.Head, which
	// Request may replace: what goes upstream).
	Request(s *Stream, now time.Time) Decision
	// Response is the upstream's final response head for s (pseudo
	// fields included); what it returns goes downstream.
	Response(s *Stream, head []Field) []Field
	// Timer says the deadline the handler set (Stream.SetDeadline)
	// passed, or that a held stream was granted (deadlines that count
	// from dispatch start): the handler answers (Respond), cancels
	// (Cancel) or sets another deadline.
	Timer(s *Stream, now time.Time)
	// Failed says the stream's upstream side failed before a response
	// started: the dial (a *DialError), the app's reset (a *ResetError)
	// or a lost connection (ErrUpstreamLost). If the handler does not
	// Respond, the relay resets the stream downstream.
	Failed(s *Stream, err error)
	// Done is the end of a stream that Request saw (its fields are the
	// handler's to read from now on).
	Done(s *Stream, now time.Time)
}

// DialError is an upstream connection that could not be made: nothing of
// the stream reached the app.
type DialError struct{ Err error }

func (e *DialError) Error() string { return "h2relay: dial upstream: " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// ResetError is the app's RST_STREAM before a response started. Refused
// (REFUSED_STREAM or a GOAWAY below the stream) means the app did not
// process the stream.
type ResetError struct{ Code http2.ErrCode }

func (e *ResetError) Error() string { return "h2relay: the app reset the stream: " + e.Code.String() }

// Refused reports whether the app did not process the stream (RFC 9113
// §8.7).
func (e *ResetError) Refused() bool { return e.Code == http2.ErrCodeRefusedStream }

// ErrUpstreamLost is an upstream connection that broke with the stream on
// it.
var ErrUpstreamLost = errors.New("h2relay: the connection to the app was lost")

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Down is the downstream connections' limits (Role is set to
	// Server); Up the upstream ones' (Role Client).
	Down, Up Config
	// Dial makes an upstream connection (h2c, prior knowledge) to target
	// (a stream's Target: "" unless the handler sets one, as the
	// gateway does with an instance's address). Each target has a pool
	// of its own in each group.
	Dial func(ctx context.Context, target string) (net.Conn, error)
	// Handler admits and accounts for the streams.
	Handler Handler
	// WriteTimeout cuts a connection whose peer takes no bytes for that
	// long [30 s].
	WriteTimeout time.Duration
	// MaxUpstreams is how many upstream connections one downstream
	// connection may use at once [4]; more streams than their limits
	// allow wait.
	MaxUpstreams int
	// MaxBuffered bounds the bytes written to one connection and not yet
	// taken by its peer beyond what the windows allow [4 MiB]; past it
	// the connection is cut.
	MaxBuffered int
	// Groups is how many lock domains the connections are spread over,
	// each with its own pool of upstream connections [GOMAXPROCS].
	Groups int
	// Log receives connection-level events; nil discards them.
	Log *slog.Logger
	// NoEventLoop reads every socket with a goroutine of its own instead
	// of the groups' event loops (eploop_linux.go; tests, comparisons).
	NoEventLoop bool
	// NoEventLoopDown reads the downstream sockets with a goroutine each
	// (the upstream ones stay in the event loops): for a caller whose
	// server may close a connection under the relay (net/http's
	// Server.Close closes the connections it handed over), which a loop
	// would never see end.
	NoEventLoopDown bool
}

// Relay relays HTTP/2 streams from downstream connections (ServeConn) to
// upstream connections it dials, each downstream connection with its own
// pool of upstream connections onto which its streams are multiplexed
// (stream IDs mapped, HPACK per connection).
//
// What it guarantees: per connection a fixed number of goroutines, not
// one per stream (a reader per socket; a write is made by whichever
// reader finishes a turn with bytes to send, one write for all of them);
// every frame passes Conn's state machines on both sides; what a stream
// can make the relay hold is bounded by the receive windows (credit goes
// back to a sender only once its bytes went on), so a slow reader holds
// its writer back end to end; RST_STREAM, trailers, GOAWAY (draining) and
// PING pass or are answered as RFC 9113 says.
type Relay struct {
	cfg RelayConfig
	log *slog.Logger

	groups []*group
	next   atomic.Uint32 // the group of the next connection

	mu       sync.Mutex
	sessions map[*session]struct{}
	draining bool
	closed   bool
	wg       sync.WaitGroup
}

// NewRelay checks cfg and returns a Relay.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.Down.Role, cfg.Up.Role = Server, Client
	var errs []error
	for _, c := range []*Config{&cfg.Down, &cfg.Up} {
		cc := *c
		cc.setDefaults()
		if err := cc.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.Dial == nil || cfg.Handler == nil {
		errs = append(errs, errors.New("Dial and Handler are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("h2relay: relay config: %w", err)
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.MaxUpstreams <= 0 {
		cfg.MaxUpstreams = 4
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = 4 << 20
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r := &Relay{cfg: cfg, log: log, sessions: map[*session]struct{}{}}
	if cfg.Groups <= 0 {
		cfg.Groups = runtime.GOMAXPROCS(0)
	}
	for range cfg.Groups {
		r.groups = append(r.groups, newGroup(r))
	}
	return r, nil
}

// isDraining reports whether Drain was called.
func (r *Relay) isDraining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.draining
}

// ServeConn relays the streams of nc, whose client preface (the 24 bytes
// of http2.ClientPreface) was read already, until the connection ends;
// held is what was read of nc after the preface (read first). nc is best
// the socket itself (a *net.TCPConn): the relay then reads and writes it
// with raw system calls.
func (r *Relay) ServeConn(nc net.Conn, held []byte) {
	g := r.groups[int(r.next.Add(1))%len(r.groups)]
	s, err := newSession(g, nc, held)
	if err != nil {
		r.log.Warn("h2 relay: connection not served", "error", err)
		nc.Close()
		return
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		nc.Close()
		return
	}
	r.sessions[s] = struct{}{}
	r.wg.Add(1)
	draining := r.draining
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.sessions, s)
		r.mu.Unlock()
		r.wg.Done()
	}()
	s.start(draining)
	s.serve()
}

// Drain sends every connection a GOAWAY (those accepted later too): their
// open streams finish, new ones are refused, and each connection closes
// after its last stream.
func (r *Relay) Drain() {
	r.mu.Lock()
	r.draining = true
	ss := make([]*session, 0, len(r.sessions))
	for s := range r.sessions {
		ss = append(ss, s)
	}
	r.mu.Unlock()
	for _, s := range ss {
		s.drain()
	}
	if len(ss) == 0 {
		for _, g := range r.groups {
			now := g.lock()
			g.retire(now)
			g.endTurn(now)
		}
	}
}

// Close cuts every connection; their streams end (Handler.Done).
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	for _, g := range r.groups {
		g.cut()
	}
}

// Wait waits up to d for every connection to end; false: some did not.
func (r *Relay) Wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Conns is the number of downstream connections served now.
func (r *Relay) Conns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sessions)
}
