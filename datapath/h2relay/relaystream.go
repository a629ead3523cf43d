package h2relay

import (
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Field is a header field (pseudo fields included).
type Field = hpack.HeaderField

// streamPhase is where a relayed stream is.
type streamPhase uint8

const (
	phaseHeld     streamPhase = iota // admitted later (Hold), or waiting for an upstream stream
	phaseUpstream                    // open upstream (upID set)
	phaseAnswered                    // answered by the handler or the relay; nothing goes upstream
)

// Stream is one relayed stream: a downstream stream and, once admitted,
// its upstream stream. Its fields and methods are its session's: the
// Handler uses them from its callbacks (session locked) and Grant from
// anywhere; after Done they are the handler's alone.
type Stream struct {
	sess *session
	id   uint32 // downstream stream ID

	// Head is the request head; Request may replace it (what goes
	// upstream).
	Head []Field
	// Arrived is when the head was read.
	Arrived time.Time
	// User is the handler's.
	User any
	// Target is the upstream the stream opens on (RelayConfig.Dial's
	// target), set by the handler before the stream is admitted; "" by
	// default.
	Target string
	// KeepBody is how many bytes of the request body the relay keeps,
	// once sent upstream and until the response starts, so that the
	// handler may send the stream again (Rewind); 0: none.
	KeepBody int

	phase     streamPhase
	granted   bool // Grant or Proceed: it may open upstream
	grantedAt time.Time
	inPend    bool    // in a pool's list of streams waiting for an upstream
	pendIn    *upPool // that pool
	up        *upstream
	upID      uint32
	refusals  int

	// Client to app: what could not be sent yet (beyond the upstream
	// windows, or before the upstream stream), and how the request ends.
	toUp         []byte
	toUpEnd      bool
	toUpTrailers []Field
	reqEnded     bool // the client ended its side (END_STREAM)
	upEndSent    bool
	sentUp       int64
	// replay is what went upstream of the body, kept for Rewind (at most
	// KeepBody); replayLost: more went, or trailers, or the response
	// started: the stream cannot be sent again. noCredit is how much of
	// the front of toUp is a replay, already credited to the client.
	replay     []byte
	replayLost bool
	noCredit   int
	rewound    bool // Rewind took it back in the current callback

	// App to client.
	toDown         []byte
	toDownEnd      bool
	toDownTrailers []Field
	downEndSent    bool
	localBody      bool // toDown is the relay's or handler's own answer
	lastDown       time.Time

	respStarted bool
	status      int
	bytes       int64
	deadline    time.Time
	clientReset bool
	appReset    http2.ErrCode
	appResetSet bool
	done        bool
	touched     bool
}

// RemoteAddr is the downstream connection's peer (host:port).
func (s *Stream) RemoteAddr() string { return s.sess.remote }

// GrantedAt is when the stream was admitted (zero: not yet).
func (s *Stream) GrantedAt() time.Time { return s.grantedAt }

// Granted reports whether the stream was admitted (Proceed or Grant).
func (s *Stream) Granted() bool { return s.granted }

// LastSent is when the relay last sent response body bytes downstream
// (zero: none yet).
func (s *Stream) LastSent() time.Time { return s.lastDown }

// ID is the downstream stream ID.
func (s *Stream) ID() uint32 { return s.id }

// Started reports whether a response head went downstream.
func (s *Stream) Started() bool { return s.respStarted }

// Status is the response's status (0: none yet).
func (s *Stream) Status() int { return s.status }

// Bytes is how many bytes of response body went downstream.
func (s *Stream) Bytes() int64 { return s.bytes }

// ClientReset reports whether the client reset the stream (or its
// connection went) before the response ended.
func (s *Stream) ClientReset() bool { return s.clientReset }

// Complete reports whether the response was sent to its end.
func (s *Stream) Complete() bool { return s.downEndSent }

// Header returns the first value of the request head's field name
// (lower case), "" if none.
func (s *Stream) Header(name string) string {
	for _, f := range s.Head {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// SetDeadline makes the relay call Handler.Expired at t (zero: never).
// From the handler's callbacks only.
func (s *Stream) SetDeadline(t time.Time) {
	s.deadline = t
	if !t.IsZero() {
		s.sess.g.armAt(t)
	}
}

// Grant admits a held stream (Hold): it opens upstream. From any
// goroutine but the handler's callbacks. It reports false when the stream
// ended meanwhile: the admission is unused (a slot the handler took for
// it is the handler's to give back).
func (s *Stream) Grant() bool {
	g := s.sess.g
	now := g.lock()
	if s.done || s.phase != phaseHeld || s.granted {
		g.mu.Unlock()
		return false
	}
	s.granted, s.grantedAt = true, now
	g.openUp(s, now)
	g.h.Timer(s, now)
	g.endTurn(now)
	return true
}

// Respond answers the stream with status, fields (no pseudo fields) and
// body, if no response started; an upstream stream is cancelled. From
// the handler's callbacks only.
func (s *Stream) Respond(status int, fields []Field, body []byte) {
	if s.respStarted || s.done {
		return
	}
	g := s.sess.g
	down := &s.sess.down
	now := g.now
	g.cancelUp(s, http2.ErrCodeCancel)
	s.phase = phaseAnswered
	g.unpend(s)
	g.mark(down)
	head := make([]Field, 0, len(fields)+1)
	head = append(head, Field{Name: ":status", Value: strconv.Itoa(status)})
	head = append(head, fields...)
	s.respStarted, s.status = true, status
	s.localBody = true
	if err := down.c.SendHeaders(now, s.id, head, len(body) == 0, false); err != nil {
		return
	}
	if len(body) == 0 {
		s.downEndSent = true
	} else {
		g.sendDown(s, body, true, now)
	}
	g.touch(s)
}

// Cancel resets the stream both ways with code (CANCEL for a deadline).
// From the handler's callbacks only.
func (s *Stream) Cancel(code http2.ErrCode) {
	if s.done {
		return
	}
	g := s.sess.g
	g.cancelUp(s, code)
	s.phase = phaseAnswered
	g.unpend(s)
	g.mark(&s.sess.down)
	s.sess.down.c.Reset(g.now, s.id, code)
	g.touch(s)
}

// Rewind takes back a stream whose upstream side failed before its
// response started (a dial, a reset, an answer the handler will not pass
// on), so that the handler sends it again; from Handler.Failed and
// Handler.Response only. What of the body went upstream is sent again
// from what the relay kept (KeepBody). It reports false, changing
// nothing, when that cannot be: more of the body went than was kept,
// trailers went, or the response started. After it the stream is held
// and not admitted; the handler sets Target and admits it again with
// Open (in the callback) or Admit (later, from elsewhere), or answers it.
func (s *Stream) Rewind() bool {
	g := s.sess.g
	if !g.rewindOK || s.respStarted || s.done || s.replayLost {
		return false
	}
	if s.phase == phaseUpstream && s.up != nil {
		g.mark(&s.up.side)
		s.up.c.Reset(g.now, s.upID, http2.ErrCodeCancel)
		delete(s.up.streams, s.upID)
		g.freed = true
	}
	g.dropToDown(s, g.now)
	g.unpend(s)
	if len(s.replay) > 0 {
		// Credited to the client when it first went: not again.
		s.toUp = append(s.replay, s.toUp...)
		s.noCredit += len(s.replay)
		s.replay = nil
	}
	s.sentUp = 0
	s.toUpEnd = s.reqEnded
	s.upEndSent = false
	s.phase, s.up, s.upID = phaseHeld, nil, 0
	s.granted, s.grantedAt = false, time.Time{}
	s.rewound = true
	g.touch(s)
	return true
}

// Open admits a held stream from a handler callback other than Request
// (which returns Proceed instead): it opens upstream, to its Target, at
// the end of the turn.
func (s *Stream) Open() {
	if s.done || s.phase != phaseHeld || s.granted {
		return
	}
	g := s.sess.g
	s.granted, s.grantedAt = true, g.now
	g.opening = append(g.opening, s)
}

// Admit is Grant with a decision: from any goroutine but the handler's
// callbacks, it runs fn with the stream's session locked, if the stream
// is still held; fn sets Target (or answers the stream with Respond) and
// returns whether to open it upstream. Admit reports false, without
// calling fn, when the stream ended or was admitted meanwhile: whatever
// the caller reserved for it is the caller's to give back.
func (s *Stream) Admit(fn func(now time.Time) bool) bool {
	g := s.sess.g
	now := g.lock()
	if s.done || s.phase != phaseHeld || s.granted {
		g.mu.Unlock()
		return false
	}
	if fn(now) && !s.done && s.phase == phaseHeld && !s.granted {
		s.granted, s.grantedAt = true, now
		g.openUp(s, now)
		g.h.Timer(s, now)
	}
	g.touch(s)
	g.endTurn(now)
	return true
}

// keepSent keeps b, sent upstream, for Rewind while it fits KeepBody.
func (s *Stream) keepSent(b []byte) {
	if s.replayLost || len(b) == 0 {
		return
	}
	if len(s.replay)+len(b) > s.KeepBody {
		s.replay, s.replayLost = nil, true
		return
	}
	s.replay = append(s.replay, b...)
}
