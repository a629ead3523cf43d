package h2relay

import (
	"fmt"

	"golang.org/x/net/http2"
)

// Phase is a stream's state in RFC 9113's figure (§5.1). The relay never
// pushes and refuses pushes (SETTINGS_ENABLE_PUSH = 0), so the reserved
// states do not occur; a PUSH_PROMISE is a connection error wherever it
// comes.
type Phase uint8

const (
	PhaseIdle Phase = iota
	PhaseOpen
	// PhaseHalfClosedLocal: this side sent END_STREAM; the peer may
	// still send.
	PhaseHalfClosedLocal
	// PhaseHalfClosedRemote: the peer sent END_STREAM; this side may
	// still send.
	PhaseHalfClosedRemote
	PhaseClosed
)

func (p Phase) String() string {
	switch p {
	case PhaseIdle:
		return "idle"
	case PhaseOpen:
		return "open"
	case PhaseHalfClosedLocal:
		return "half-closed (local)"
	case PhaseHalfClosedRemote:
		return "half-closed (remote)"
	case PhaseClosed:
		return "closed"
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// StreamState is a stream's phase and what HTTP semantics add to it
// (RFC 9113 §8.1): whether each side has sent its (final) header block,
// so that a second one is trailers and must end the stream.
type StreamState struct {
	Phase                       Phase
	LocalHeaders, RemoteHeaders bool
}

// StreamEvent is what happens to a stream: a frame received from the peer
// (Recv*) or sent by this side (Send*). END_STREAM is its own event.
type StreamEvent uint8

const (
	// RecvHeaders is a header block without END_STREAM: the peer's head
	// (request or final response), or, if it sent one already, trailers
	// that forgot END_STREAM.
	RecvHeaders StreamEvent = iota
	RecvHeadersEnd
	RecvData
	RecvDataEnd
	RecvRST
	RecvWindowUpdate
	RecvPriority
	// RecvInformational is a 1xx response head (a client's stream only;
	// the connection tells by :status): allowed before the final head,
	// it changes nothing.
	RecvInformational
	SendHeaders
	SendHeadersEnd
	SendData
	SendDataEnd
	SendRST
	SendWindowUpdate
	SendInformational
	numStreamEvents
)

var eventNames = [...]string{
	RecvHeaders: "recv HEADERS", RecvHeadersEnd: "recv HEADERS+END_STREAM", RecvData: "recv DATA",
	RecvDataEnd: "recv DATA+END_STREAM", RecvRST: "recv RST_STREAM", RecvWindowUpdate: "recv WINDOW_UPDATE",
	RecvPriority: "recv PRIORITY", RecvInformational: "recv 1xx HEADERS", SendHeaders: "send HEADERS", SendHeadersEnd: "send HEADERS+END_STREAM",
	SendData: "send DATA", SendDataEnd: "send DATA+END_STREAM", SendRST: "send RST_STREAM",
	SendWindowUpdate: "send WINDOW_UPDATE", SendInformational: "send 1xx HEADERS",
}

func (e StreamEvent) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("StreamEvent(%d)", uint8(e))
}

// Received reports whether e is a frame from the peer.
func (e StreamEvent) Received() bool { return e <= RecvInformational }

// Violation is what a forbidden event costs (RFC 9113 §5.1, §5.4): the
// stream (RST_STREAM) or the whole connection (GOAWAY), with a code. A
// forbidden Send* event is a bug of the relay, reported as a stream error
// with INTERNAL_ERROR: the stream is reset, never sent on.
type Violation struct {
	Conn bool // a connection error; otherwise a stream error
	Code http2.ErrCode
}

func (v *Violation) Error() string {
	if v.Conn {
		return "connection error: " + v.Code.String()
	}
	return "stream error: " + v.Code.String()
}

// Next is the stream state machine: the state after e in s, or the
// violation e is in s (the stream is then closed; for a connection error
// the connection goes too). It is a pure function of its arguments, so the
// whole machine is a table (the tests check it against the RFC's figure
// and FuzzStreamMachine against an independent model).
//
// Rules worth naming:
//   - HEADERS opens an idle stream. A header block after a side's final
//     head is trailers and must carry END_STREAM (§8.1): received without
//     it, a stream PROTOCOL_ERROR; a 1xx head (Informational) may come
//     any number of times before the final one, and not after it.
//   - DATA before the sender's head is a stream PROTOCOL_ERROR (§8.1: a
//     message is a head, then content).
//   - DATA or HEADERS received on a stream the peer has half-closed is
//     STREAM_CLOSED (§5.1 half-closed (remote)); on an idle stream it is a
//     connection PROTOCOL_ERROR (§5.1 idle).
//   - Frames received on a closed stream: RST_STREAM, WINDOW_UPDATE and
//     PRIORITY are ignored (they may cross an RST_STREAM this side sent,
//     §5.1 closed); DATA and HEADERS are a stream STREAM_CLOSED error.
//     The connection decides, by the stream's ID, whether a closed stream
//     is one it knew or one never opened (a connection error then).
//   - RST_STREAM and WINDOW_UPDATE received on an idle stream are a
//     connection PROTOCOL_ERROR; PRIORITY is allowed there (§5.1 idle).
//   - A forbidden Send* event is a bug of the relay: a stream
//     INTERNAL_ERROR, so that the stream is reset rather than sent on.
func Next(s StreamState, e StreamEvent) (StreamState, *Violation) {
	closed := StreamState{Phase: PhaseClosed, LocalHeaders: s.LocalHeaders, RemoteHeaders: s.RemoteHeaders}
	streamErr := func(code http2.ErrCode) (StreamState, *Violation) { return closed, &Violation{Code: code} }
	connErr := func(code http2.ErrCode) (StreamState, *Violation) {
		return closed, &Violation{Conn: true, Code: code}
	}
	recv := e.Received()
	if !recv && s.Phase != PhaseClosed || recv && s.Phase != PhaseIdle && s.Phase != PhaseClosed {
		// HTTP's own rules first: heads, trailers, content.
		switch e {
		case RecvHeaders:
			if s.RemoteHeaders {
				return streamErr(http2.ErrCodeProtocol)
			}
		case RecvInformational:
			if s.RemoteHeaders {
				return streamErr(http2.ErrCodeProtocol)
			}
		case RecvData, RecvDataEnd:
			if !s.RemoteHeaders && s.Phase != PhaseHalfClosedRemote {
				return streamErr(http2.ErrCodeProtocol)
			}
		case SendHeaders, SendInformational:
			if s.LocalHeaders {
				return streamErr(http2.ErrCodeInternal)
			}
		case SendData, SendDataEnd:
			if !s.LocalHeaders && s.Phase != PhaseHalfClosedLocal {
				return streamErr(http2.ErrCodeInternal)
			}
		}
	}
	next := s
	switch e {
	case RecvHeaders, RecvHeadersEnd:
		next.RemoteHeaders = true
	case SendHeaders, SendHeadersEnd:
		next.LocalHeaders = true
	}
	var v *Violation
	if recv {
		next.Phase, v = nextRecv(s.Phase, e)
	} else {
		next.Phase, v = nextSend(s.Phase, e)
	}
	if v != nil {
		if v.Conn {
			return connErr(v.Code)
		}
		return streamErr(v.Code)
	}
	return next, nil
}

// nextRecv is the figure's transitions for frames from the peer.
func nextRecv(p Phase, e StreamEvent) (Phase, *Violation) {
	switch p {
	case PhaseIdle:
		switch e {
		case RecvHeaders:
			return PhaseOpen, nil
		case RecvHeadersEnd:
			return PhaseHalfClosedRemote, nil
		case RecvPriority:
			return PhaseIdle, nil
		}
		return PhaseClosed, &Violation{Conn: true, Code: http2.ErrCodeProtocol}
	case PhaseOpen:
		switch e {
		case RecvHeadersEnd, RecvDataEnd:
			return PhaseHalfClosedRemote, nil
		case RecvHeaders, RecvData, RecvWindowUpdate, RecvPriority, RecvInformational:
			return PhaseOpen, nil
		case RecvRST:
			return PhaseClosed, nil
		}
	case PhaseHalfClosedLocal:
		switch e {
		case RecvHeadersEnd, RecvDataEnd, RecvRST:
			return PhaseClosed, nil
		case RecvHeaders, RecvData, RecvWindowUpdate, RecvPriority, RecvInformational:
			return PhaseHalfClosedLocal, nil
		}
	case PhaseHalfClosedRemote:
		switch e {
		case RecvHeaders, RecvHeadersEnd, RecvData, RecvDataEnd, RecvInformational:
			return PhaseClosed, &Violation{Code: http2.ErrCodeStreamClosed}
		case RecvRST:
			return PhaseClosed, nil
		case RecvWindowUpdate, RecvPriority:
			return PhaseHalfClosedRemote, nil
		}
	case PhaseClosed:
		switch e {
		case RecvRST, RecvWindowUpdate, RecvPriority:
			return PhaseClosed, nil
		}
		return PhaseClosed, &Violation{Code: http2.ErrCodeStreamClosed}
	}
	return PhaseClosed, &Violation{Conn: true, Code: http2.ErrCodeInternal}
}

// nextSend is the figure's transitions for this side's own frames.
func nextSend(p Phase, e StreamEvent) (Phase, *Violation) {
	switch p {
	case PhaseIdle:
		switch e {
		case SendHeaders:
			return PhaseOpen, nil
		case SendHeadersEnd:
			return PhaseHalfClosedLocal, nil
		}
	case PhaseOpen:
		switch e {
		case SendHeadersEnd, SendDataEnd:
			return PhaseHalfClosedLocal, nil
		case SendHeaders, SendData, SendWindowUpdate, SendInformational:
			return PhaseOpen, nil
		case SendRST:
			return PhaseClosed, nil
		}
	case PhaseHalfClosedLocal:
		switch e {
		case SendRST:
			return PhaseClosed, nil
		case SendWindowUpdate:
			return PhaseHalfClosedLocal, nil
		}
	case PhaseHalfClosedRemote:
		switch e {
		case SendHeadersEnd, SendDataEnd, SendRST:
			return PhaseClosed, nil
		case SendHeaders, SendData, SendInformational:
			return PhaseHalfClosedRemote, nil
		}
	case PhaseClosed:
		if e == SendRST {
			return PhaseClosed, nil // a reset may cross the peer's end
		}
	}
	return PhaseClosed, &Violation{Code: http2.ErrCodeInternal}
}
