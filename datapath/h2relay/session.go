package h2relay

import (
	"bufio"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// session is one downstream connection: its state and its streams, in its
// group (whose lock guards them).
type session struct {
	g       *group
	remote  string
	held    []byte // read from the connection before the relay had it
	down    side
	streams map[uint32]*Stream // by downstream stream ID
	ended   bool
}

func newSession(g *group, nc net.Conn, held []byte) (*session, error) {
	now := time.Now()
	c, err := NewConn(g.r.cfg.Down, now)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(16 << 10)
	if err != nil {
		return nil, err
	}
	s := &session{g: g, held: held, streams: map[uint32]*Stream{}}
	if a := nc.RemoteAddr(); a != nil {
		s.remote = a.String()
	}
	s.down = side{nc: nc, rw: rawio.New(nc), c: c, w: w, down: s}
	return s, nil
}

// start puts the session in its group and writes its SETTINGS.
func (s *session) start(draining bool) {
	g := s.g
	now := g.lock()
	g.sessions[s] = struct{}{}
	g.mark(&s.down)
	if draining {
		s.down.c.Drain(now)
	}
	if g.loop != nil && !g.closed && !g.r.cfg.NoEventLoopDown {
		cfg := s.down.c.cfg
		if es, ok := g.loop.add(&s.down, s.held, &cfg); ok {
			s.held = nil
			if len(es.rest) > 0 {
				g.loop.steps(es, es.rest, true, now)
			}
		}
	}
	g.endTurn(now)
}

// serve reads the connection until it ends: the event loop does, and
// serve waits for it, or serve reads it itself.
func (s *session) serve() {
	if es := s.down.ep; es != nil {
		<-es.done
		return
	}
	s.readDown()
}

// readDown reads the downstream connection's frames until it ends.
func (s *session) readDown() {
	g := s.g
	cfg := s.down.c.cfg
	var r io.Reader = s.down.rw
	if len(s.held) > 0 {
		r = &heldReader{held: s.held, r: r}
		s.held = nil
	}
	br := bufio.NewReaderSize(r, 16<<10)
	fr := newFramer(br, &cfg)
	for {
		f, err := fr.ReadFrame()
		now := g.lock()
		g.mark(&s.down)
		for {
			if err != nil {
				s.down.c.ReadError(now, err)
			} else {
				s.down.c.Step(now, f)
			}
			if s.down.c.Closed() || !frameBuffered(br) {
				break
			}
			// The next frame is in the buffer: it joins this turn, so
			// that what the two ask to write leaves in one write.
			g.turn(now)
			f, err = fr.ReadFrame()
		}
		if s.down.c.Closed() {
			g.turn(now)
			g.openAdmitted(now)
			s.ended = true
			delete(g.sessions, s)
			if len(g.sessions) == 0 && g.r.isDraining() {
				g.retire(now)
			}
			g.claimAndUnlock(now, false)
			return
		}
		g.endTurn(now)
	}
}

// heldReader reads held, then r.
type heldReader struct {
	held []byte
	r    io.Reader
}

func (h *heldReader) Read(p []byte) (int, error) {
	if len(h.held) > 0 {
		n := copy(p, h.held)
		h.held = h.held[n:]
		return n, nil
	}
	return h.r.Read(p)
}

// drain starts a graceful close of the downstream connection.
func (s *session) drain() {
	g := s.g
	now := g.lock()
	if !s.ended {
		g.mark(&s.down)
		s.down.c.Drain(now)
	}
	g.endTurn(now)
}

// onDown carries out a delivery from the downstream connection.
func (s *session) onDown(a *Action, now time.Time) {
	g := s.g
	switch a.Kind {
	case DeliverHeaders:
		st := s.streams[a.Stream]
		if st == nil {
			s.newStream(a, now)
			return
		}
		// Trailers (the state machine allows them only with END_STREAM).
		st.reqEnded = true
		switch st.phase {
		case phaseUpstream:
			if len(st.toUp) == 0 && !st.upEndSent {
				g.mark(&st.up.side)
				if st.up.c.SendHeaders(now, st.upID, a.Fields, true, false) == nil {
					st.upEndSent = true
				}
				st.replay, st.replayLost = nil, true
				break
			}
			st.toUpTrailers, st.toUpEnd = a.Fields, true
		case phaseHeld:
			st.toUpTrailers, st.toUpEnd = a.Fields, true
		}
		g.touch(st)
	case DeliverData:
		st := s.streams[a.Stream]
		if st == nil || st.phase == phaseAnswered {
			s.down.c.Consumed(now, a.Stream, len(a.Data))
			if st != nil {
				if a.End {
					st.reqEnded = true
				}
				g.touch(st)
			}
			return
		}
		if a.End {
			st.reqEnded = true
		}
		if st.phase == phaseUpstream {
			g.sendUp(st, a.Data, a.End, now)
		} else {
			st.toUp = append(st.toUp, a.Data...)
			st.toUpEnd = st.toUpEnd || a.End
		}
		g.touch(st)
	case DeliverReset:
		st := s.streams[a.Stream]
		if st == nil {
			return
		}
		if !st.downEndSent {
			st.clientReset = true
		}
		g.cancelUp(st, http2.ErrCodeCancel)
		st.phase = phaseAnswered
		g.unpend(st)
		g.touch(st)
	case DeliverCredit:
		if a.Stream != 0 {
			if st := s.streams[a.Stream]; st != nil && len(st.toDown) > 0 {
				g.pumpDown(st, now)
			}
			return
		}
		for _, st := range s.streams {
			if len(st.toDown) > 0 {
				g.pumpDown(st, now)
			}
		}
	case PeerGoAway:
		// The client opens no more streams; ours were never any.
	case CloseConn:
		s.down.closing = true
	}
}

// newStream admits a new downstream stream.
func (s *session) newStream(a *Action, now time.Time) {
	g := s.g
	if !validRequest(a.Fields) {
		s.down.c.Reset(now, a.Stream, http2.ErrCodeProtocol)
		return
	}
	st := &Stream{sess: s, id: a.Stream, Head: a.Fields, Arrived: now, reqEnded: a.End, toUpEnd: a.End}
	s.streams[a.Stream] = st
	g.touch(st)
	switch g.h.Request(st, now) {
	case Proceed:
		st.granted, st.grantedAt = true, now
		g.opening = append(g.opening, st)
	case Answered:
		if !st.respStarted && st.phase != phaseAnswered {
			st.Cancel(http2.ErrCodeInternal)
		}
	}
}

// pseudo returns the value of pseudo field name.
func pseudo(fields []Field, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
		if len(f.Name) == 0 || f.Name[0] != ':' {
			break
		}
	}
	return ""
}

// validRequest checks a request head as RFC 9113 §8.3.1 and §8.2.2 ask of
// an intermediary: :method, :scheme and :path present (CONNECT is not
// relayed), no connection-specific fields, TE only "trailers". The Framer
// checked the pseudo fields' names, order and uniqueness and every field's
// characters.
func validRequest(fields []Field) bool {
	var method, scheme, path bool
	for _, f := range fields {
		switch f.Name {
		case ":method":
			method = f.Value != "" && f.Value != "CONNECT"
		case ":scheme":
			scheme = f.Value != ""
		case ":path":
			path = f.Value != ""
		case ":status", ":protocol":
			return false
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			return false
		case "te":
			if f.Value != "trailers" {
				return false
			}
		}
	}
	return method && scheme && path
}
