package h2relay

import (
	"testing"

	"golang.org/x/net/http2"
)

// The figure of RFC 9113 §5.1, row by row, with HTTP's rules on heads and
// trailers (§8.1).
func TestNextTable(t *testing.T) {
	idle := StreamState{}
	open := StreamState{Phase: PhaseOpen, RemoteHeaders: true}
	openBoth := StreamState{Phase: PhaseOpen, RemoteHeaders: true, LocalHeaders: true}
	hcr := StreamState{Phase: PhaseHalfClosedRemote, RemoteHeaders: true}
	hcrAnswered := StreamState{Phase: PhaseHalfClosedRemote, RemoteHeaders: true, LocalHeaders: true}
	clientOpen := StreamState{Phase: PhaseOpen, LocalHeaders: true}
	hcl := StreamState{Phase: PhaseHalfClosedLocal, LocalHeaders: true}
	closed := StreamState{Phase: PhaseClosed}
	type want struct {
		phase Phase
		conn  bool
		code  http2.ErrCode // with ok false
		ok    bool
	}
	ok := func(p Phase) want { return want{phase: p, ok: true} }
	streamErr := func(c http2.ErrCode) want { return want{phase: PhaseClosed, code: c} }
	connErr := func(c http2.ErrCode) want { return want{phase: PhaseClosed, conn: true, code: c} }
	for _, tc := range []struct {
		name string
		s    StreamState
		e    StreamEvent
		want want
	}{
		// idle
		{"request head opens", idle, RecvHeaders, ok(PhaseOpen)},
		{"GET: head with END_STREAM", idle, RecvHeadersEnd, ok(PhaseHalfClosedRemote)},
		{"PRIORITY on idle", idle, RecvPriority, ok(PhaseIdle)},
		{"DATA on idle", idle, RecvData, connErr(http2.ErrCodeProtocol)},
		{"RST on idle", idle, RecvRST, connErr(http2.ErrCodeProtocol)},
		{"WINDOW_UPDATE on idle", idle, RecvWindowUpdate, connErr(http2.ErrCodeProtocol)},
		{"client opens", idle, SendHeaders, ok(PhaseOpen)},
		{"client opens, no body", idle, SendHeadersEnd, ok(PhaseHalfClosedLocal)},
		{"sending DATA on idle is a bug", idle, SendData, streamErr(http2.ErrCodeInternal)},
		// open (server, request head received)
		{"request body", open, RecvData, ok(PhaseOpen)},
		{"request body ends", open, RecvDataEnd, ok(PhaseHalfClosedRemote)},
		{"request trailers", open, RecvHeadersEnd, ok(PhaseHalfClosedRemote)},
		{"trailers without END_STREAM", open, RecvHeaders, streamErr(http2.ErrCodeProtocol)},
		{"peer resets", open, RecvRST, ok(PhaseClosed)},
		{"response head", open, SendHeaders, ok(PhaseOpen)},
		{"DATA before the response head is a bug", open, SendData, streamErr(http2.ErrCodeInternal)},
		{"response body", openBoth, SendData, ok(PhaseOpen)},
		{"a second response head is a bug", openBoth, SendHeaders, streamErr(http2.ErrCodeInternal)},
		{"response trailers", openBoth, SendHeadersEnd, ok(PhaseHalfClosedLocal)},
		{"1xx before the head", open, SendInformational, ok(PhaseOpen)},
		{"1xx after the head is a bug", openBoth, SendInformational, streamErr(http2.ErrCodeInternal)},
		// half-closed (remote): the request is in
		{"DATA after END_STREAM", hcr, RecvData, streamErr(http2.ErrCodeStreamClosed)},
		{"HEADERS after END_STREAM", hcr, RecvHeadersEnd, streamErr(http2.ErrCodeStreamClosed)},
		{"WINDOW_UPDATE while answering", hcr, RecvWindowUpdate, ok(PhaseHalfClosedRemote)},
		{"answer ends", hcrAnswered, SendDataEnd, ok(PhaseClosed)},
		{"head-only answer", hcr, SendHeadersEnd, ok(PhaseClosed)},
		{"peer resets while answered", hcr, RecvRST, ok(PhaseClosed)},
		// client side
		{"response head", clientOpen, RecvHeaders, ok(PhaseOpen)},
		{"103 Early Hints", clientOpen, RecvInformational, ok(PhaseOpen)},
		{"DATA before the response head", clientOpen, RecvData, streamErr(http2.ErrCodeProtocol)},
		{"response on a finished request", hcl, RecvHeaders, ok(PhaseHalfClosedLocal)},
		{"response ends", StreamState{Phase: PhaseHalfClosedLocal, LocalHeaders: true, RemoteHeaders: true}, RecvDataEnd, ok(PhaseClosed)},
		{"sending after END_STREAM is a bug", hcl, SendData, streamErr(http2.ErrCodeInternal)},
		{"reset after END_STREAM", hcl, SendRST, ok(PhaseClosed)},
		// closed
		{"RST crossing ours", closed, RecvRST, ok(PhaseClosed)},
		{"WINDOW_UPDATE crossing ours", closed, RecvWindowUpdate, ok(PhaseClosed)},
		{"DATA on closed", closed, RecvData, streamErr(http2.ErrCodeStreamClosed)},
		{"HEADERS on closed", closed, RecvHeaders, streamErr(http2.ErrCodeStreamClosed)},
		{"sending on closed is a bug", closed, SendData, streamErr(http2.ErrCodeInternal)},
		{"reset on closed", closed, SendRST, ok(PhaseClosed)},
	} {
		got, v := Next(tc.s, tc.e)
		if got.Phase != tc.want.phase {
			t.Errorf("%s: %v on %v -> %v, want %v", tc.name, tc.e, tc.s.Phase, got.Phase, tc.want.phase)
		}
		switch {
		case tc.want.ok && v != nil:
			t.Errorf("%s: unexpected %v", tc.name, v)
		case !tc.want.ok && (v == nil || v.Conn != tc.want.conn || v.Code != tc.want.code):
			t.Errorf("%s: got %v, want conn=%v %v", tc.name, v, tc.want.conn, tc.want.code)
		}
	}
}

// model is an independent statement of the stream rules, written as
// "what each side may still do" rather than as the figure's states, for
// FuzzStreamMachine to hold Next against.
type model struct {
	started                 bool // some HEADERS went either way (or PRIORITY only: still idle)
	localHead, remoteHead   bool
	localEnded, remoteEnded bool
	reset                   bool
}

func (m *model) phase() Phase {
	switch {
	case m.reset || m.localEnded && m.remoteEnded:
		return PhaseClosed
	case !m.started:
		return PhaseIdle
	case m.localEnded:
		return PhaseHalfClosedLocal
	case m.remoteEnded:
		return PhaseHalfClosedRemote
	}
	return PhaseOpen
}

// step applies e; it returns whether e is allowed, and if not whether the
// connection (not only the stream) is at fault.
func (m *model) step(e StreamEvent) (allowed, conn bool) {
	closed := m.phase() == PhaseClosed
	idle := m.phase() == PhaseIdle
	switch e {
	case RecvPriority:
		return true, false
	case RecvRST:
		if idle {
			return false, true
		}
		m.reset = true
		return true, false
	case RecvWindowUpdate:
		return !idle, idle
	case SendRST:
		if idle {
			return false, false
		}
		m.reset = true
		return true, false
	case SendWindowUpdate:
		return !idle && !closed && !m.remoteEnded, false
	}
	if e.Received() {
		if idle && (e == RecvData || e == RecvDataEnd || e == RecvInformational) {
			return false, true
		}
		if closed || m.remoteEnded {
			return false, false
		}
		switch e {
		case RecvHeaders, RecvInformational:
			if m.remoteHead {
				return false, false
			}
			m.remoteHead = e == RecvHeaders
		case RecvHeadersEnd:
			m.remoteHead, m.remoteEnded = true, true
		case RecvData, RecvDataEnd:
			if !m.remoteHead {
				return false, false
			}
			m.remoteEnded = e == RecvDataEnd
		}
		m.started = true
		return true, false
	}
	if closed || m.localEnded {
		return false, false
	}
	switch e {
	case SendHeaders, SendInformational:
		if m.localHead || idle && e == SendInformational {
			return false, false
		}
		m.localHead = e == SendHeaders
	case SendHeadersEnd:
		m.localHead, m.localEnded = true, true
	case SendData, SendDataEnd:
		if !m.localHead {
			return false, false
		}
		m.localEnded = e == SendDataEnd
	}
	m.started = true
	return true, false
}

// Any sequence of events: Next agrees with the model on every step (state,
// allowed or not, stream or connection error), never leaves a closed
// stream, and every violation closes the stream.
func FuzzStreamMachine(f *testing.F) {
	f.Add([]byte{byte(RecvHeadersEnd), byte(SendHeaders), byte(SendData), byte(SendDataEnd)})
	f.Add([]byte{byte(SendHeaders), byte(RecvInformational), byte(RecvHeaders), byte(RecvData), byte(RecvHeadersEnd)})
	f.Add([]byte{byte(RecvHeaders), byte(RecvData), byte(RecvRST), byte(RecvData)})
	f.Add([]byte{byte(RecvPriority), byte(RecvWindowUpdate)})
	f.Fuzz(func(t *testing.T, events []byte) {
		var s StreamState
		var m model
		for i, b := range events {
			e := StreamEvent(b % byte(numStreamEvents))
			before := s
			next, v := Next(s, e)
			allowed, conn := m.step(e)
			if allowed != (v == nil) {
				t.Fatalf("event %d %v on %+v: Next says %v, the model allowed=%v", i, e, before, v, allowed)
			}
			if v != nil {
				if v.Conn != conn {
					t.Fatalf("event %d %v on %+v: %v, the model says connection error = %v", i, e, before, v, conn)
				}
				if next.Phase != PhaseClosed {
					t.Fatalf("a violation left the stream %v", next.Phase)
				}
				return // the stream (or connection) is gone
			}
			if next.Phase != m.phase() {
				t.Fatalf("event %d %v on %+v: %v, the model says %v", i, e, before, next.Phase, m.phase())
			}
			if before.Phase == PhaseClosed && next.Phase != PhaseClosed {
				t.Fatal("a closed stream reopened")
			}
			s = next
		}
	})
}
