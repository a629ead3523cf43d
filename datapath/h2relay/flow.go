package h2relay

import (
	"time"

	"golang.org/x/net/http2"
)

// Flow control end to end: data passes on within the receiving peer's
// windows and is credited back to its sender only once it did; what does
// not fit is held, at most a stream's receive window.

// sendUp passes data of the client's to st's upstream stream: what the
// app's windows allow now, the rest held (and not credited back to the
// client until it is sent).
func (g *group) sendUp(st *Stream, data []byte, end bool, now time.Time) {
	if len(st.toUp) == 0 && !st.upEndSent && st.toUpTrailers == nil {
		u := st.up
		g.mark(&u.side)
		n := min(len(data), u.c.SendWindow(st.upID))
		if n == len(data) {
			if u.c.SendData(now, st.upID, data, end) == nil {
				g.creditDown(st, n, now)
				st.keepSent(data)
				st.sentUp += int64(n)
				st.upEndSent = end
			}
			return
		}
		if n > 0 && u.c.SendData(now, st.upID, data[:n], false) == nil {
			g.creditDown(st, n, now)
			st.keepSent(data[:n])
			st.sentUp += int64(n)
			data = data[n:]
		}
	}
	st.toUp = append(st.toUp, data...)
	st.toUpEnd = st.toUpEnd || end
}

// pumpUp sends what st holds for the app as far as the windows allow.
func (g *group) pumpUp(st *Stream, now time.Time) {
	if st.phase != phaseUpstream || st.upEndSent {
		return
	}
	u := st.up
	down := &st.sess.down
	g.mark(&u.side)
	g.mark(down)
	for len(st.toUp) > 0 {
		n := min(len(st.toUp), u.c.SendWindow(st.upID))
		if n == 0 {
			return
		}
		end := n == len(st.toUp) && st.toUpEnd && st.toUpTrailers == nil
		if u.c.SendData(now, st.upID, st.toUp[:n], end) != nil {
			return
		}
		g.creditDown(st, n, now)
		st.keepSent(st.toUp[:n])
		st.sentUp += int64(n)
		st.upEndSent = end
		// The frame's bytes are read by the Writer later in the turn:
		// the buffer is never written to again (a new one is made).
		st.toUp = st.toUp[n:]
	}
	st.toUp = nil
	switch {
	case st.upEndSent:
	case st.toUpTrailers != nil:
		if u.c.SendHeaders(now, st.upID, st.toUpTrailers, true, false) == nil {
			st.upEndSent = true
		}
		st.toUpTrailers, st.replay, st.replayLost = nil, nil, true
	case st.toUpEnd:
		if u.c.SendData(now, st.upID, nil, true) == nil {
			st.upEndSent = true
		}
	}
}

// dropToUp forgets what st holds for the app and credits it back to the
// client.
func (g *group) dropToUp(st *Stream, now time.Time) {
	if len(st.toUp) > 0 {
		g.mark(&st.sess.down)
		g.creditDown(st, len(st.toUp), now)
	}
	st.toUp, st.toUpTrailers = nil, nil
	st.noCredit = 0
}

// creditDown gives n bytes of the client's, passed on (or dropped), back
// to it; a replay's bytes (Rewind) were credited when they first went.
func (g *group) creditDown(st *Stream, n int, now time.Time) {
	if st.noCredit > 0 {
		k := min(n, st.noCredit)
		st.noCredit -= k
		n -= k
	}
	if n > 0 {
		st.sess.down.c.Consumed(now, st.id, n)
	}
}

// sendDown passes data of the app's to the client: what the client's
// windows allow now, the rest held (and not credited back to the app
// until it is sent).
func (g *group) sendDown(st *Stream, data []byte, end bool, now time.Time) {
	down := &st.sess.down
	g.mark(down)
	if len(st.toDown) == 0 && !st.downEndSent && st.toDownTrailers == nil {
		n := min(len(data), down.c.SendWindow(st.id))
		if n == len(data) {
			if down.c.SendData(now, st.id, data, end) == nil {
				g.creditUp(st, n, now)
				st.bytes += int64(n)
				st.lastDown = now
				st.downEndSent = end
			}
			return
		}
		if n > 0 && down.c.SendData(now, st.id, data[:n], false) == nil {
			g.creditUp(st, n, now)
			st.bytes += int64(n)
			st.lastDown = now
			data = data[n:]
		}
	}
	st.toDown = append(st.toDown, data...)
	st.toDownEnd = st.toDownEnd || end
}

// creditUp gives n bytes the client took back to the app (to its
// connection only, once the app's stream closed).
func (g *group) creditUp(st *Stream, n int, now time.Time) {
	if st.up != nil && !st.localBody {
		g.mark(&st.up.side)
		st.up.c.Consumed(now, st.upID, n)
	}
}

// pumpDown sends what st holds for the client as far as the windows allow.
func (g *group) pumpDown(st *Stream, now time.Time) {
	if st.downEndSent {
		return
	}
	down := &st.sess.down
	g.mark(down)
	for len(st.toDown) > 0 {
		n := min(len(st.toDown), down.c.SendWindow(st.id))
		if n == 0 {
			return
		}
		end := n == len(st.toDown) && st.toDownEnd && st.toDownTrailers == nil
		if down.c.SendData(now, st.id, st.toDown[:n], end) != nil {
			return
		}
		g.creditUp(st, n, now)
		st.bytes += int64(n)
		st.lastDown = now
		st.downEndSent = end
		st.toDown = st.toDown[n:]
	}
	st.toDown = nil
	switch {
	case st.downEndSent:
	case st.toDownTrailers != nil:
		if down.c.SendHeaders(now, st.id, st.toDownTrailers, true, false) == nil {
			st.downEndSent = true
		}
		st.toDownTrailers = nil
	case st.toDownEnd:
		if down.c.SendData(now, st.id, nil, true) == nil {
			st.downEndSent = true
		}
	}
	g.touch(st)
}

// cancelUp resets st's upstream stream, if it has one open, and drops
// what the stream holds for either side (credited back).
func (g *group) cancelUp(st *Stream, code http2.ErrCode) {
	if st.phase == phaseUpstream && st.up != nil {
		g.mark(&st.up.side)
		st.up.c.Reset(g.now, st.upID, code)
		delete(st.up.streams, st.upID)
		g.freed = true
	}
	g.dropToUp(st, g.now)
	if !st.localBody {
		g.dropToDown(st, g.now)
	}
}

// dropToDown forgets what st holds for the client and credits it back to
// the app.
func (g *group) dropToDown(st *Stream, now time.Time) {
	if len(st.toDown) > 0 {
		g.creditUp(st, len(st.toDown), now)
	}
	st.toDown, st.toDownTrailers = nil, nil
}
