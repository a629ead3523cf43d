package keepalive

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
)

// ScreenConn stands between a client connection and the net/http server
// that reads it, and refuses request heads that net/http would take but a
// front proxy could frame differently (h1.ScreenHead: Content-Length with
// Transfer-Encoding, duplicate Content-Length, obs-fold, chunked HTTP/1.0).
// Such a head never reaches net/http whole: its final empty line is
// replaced by a line net/http cannot parse, so it answers 400 Bad Request
// with Connection: close, and nothing of the request is served or passed
// on. Everything else passes byte for byte.
//
// To find every head on the connection it follows the body framing as
// net/http does (Content-Length, chunked with trailers, the CR/LF net/http
// skips after a POST); it stops looking (and passes the rest through) at
// anything that is not a plain HTTP/1 request stream: a head net/http
// refuses (it closes the connection), a malformed chunked body (net/http
// fails it; the proxies then close the connection), CONNECT, HTTP/2's
// preface, a head too big for the server (net/http answers 431), and a
// protocol switch answered 101 (it watches the responses written for
// that).
//
// A head's last line is held back until the head is complete and
// screened; nothing else is delayed, so net/http's own timeouts
// (ReadHeaderTimeout against slow heads) work as before. Its memory is the
// head being read, bounded by maxHead.
//
// Once the head read is HTTP/2's preface, nothing that follows is an
// HTTP/1 head, and the screen reads ahead (readAhead): the HTTP/2 server
// reads its frames in small pieces (a 9-byte frame header, then the
// payload), each a system call on the socket without it.
//
// Reads are the reader's (net/http never reads concurrently); Write may
// run at the same time and only looks at a response's status line while
// a protocol switch is pending.
type ScreenConn struct {
	net.Conn
	maxHead int

	// The reader's state.
	state     screenState
	head      []byte // the head being read (screenHead), as given out
	lineStart int    // where its current line starts
	cr        bool   // a CR that may start the head's empty line is held
	skip      int    // CR/LF bytes net/http may skip before the next head
	left      int64  // bytes left in a fixed body or a chunk
	line      []byte // the chunk-size or trailer line being read
	post      bool   // the request whose body is read is a POST
	out       []byte // screened bytes waiting for the reader (or the poison)
	scratch   [512]byte

	// h2 is set once the head read was HTTP/2's preface: from then on
	// reads go through ahead, which holds what was read from the socket
	// and not yet given to the reader (ahead[aheadR:aheadW]).
	h2             bool
	ahead          []byte
	aheadR, aheadW int
	aheadErr       error // came with the bytes held; the reader's once they are out

	// switching is set while a protocol switch is unanswered, so that
	// Write, on every response, takes the lock only then.
	switching atomic.Bool
	mu        sync.Mutex // guards the switch: Write runs beside Read
	upgrade   bool       // a protocol switch was asked and not yet answered
	verdict   switchVerdict
	passed    bool // bytes came while the switch was unanswered
}

type screenState int

const (
	screenHead      screenState = iota // reading a head
	screenBody                         // a body of known length (left)
	screenChunkLine                    // a chunk-size line
	screenChunkData                    // chunk data (left), then CRLF
	screenChunkEnd                     // the CRLF after chunk data
	screenTrailer                      // trailer lines, until an empty one
	screenSwitch                       // a protocol switch is unanswered
	screenOpen                         // no more screening: pass through
	screenRefused                      // a head was refused: nothing more
)

type switchVerdict int

const (
	switchPending switchVerdict = iota
	switchDone                  // 101: a tunnel
	switchRefused               // a final answer other than 101
)

// poison replaces a refused head's final empty line: a header line
// without a colon, which net/http refuses with 400 and Connection: close.
var poison = []byte("Refused-By-Nomad-Serverless request framing a front proxy may read differently\r\n\r\n")

// h2Preface is the head that starts HTTP/2's connection preface
// ("PRI * HTTP/2.0", an empty line, then "SM" and another empty line).
const h2Preface = "PRI * HTTP/2.0\r\n"

// aheadSize is the read-ahead buffer of an HTTP/2 connection: HAProxy's
// buffer size, and a full frame of the default maximum size (16 KiB)
// with room for the next ones' headers. Reads at least this large go to
// the socket directly. It is allocated at the first HTTP/2 read and kept
// for the connection's life (net/http's HTTP/1 connections keep a 4 KiB
// reader; its HTTP/2 ones a frame buffer the size of the largest frame).
const aheadSize = 16 << 10

// NewScreenConn screens nc, whose next byte starts a request head; heads
// longer than maxHead are left to net/http (its MaxHeaderBytes plus its
// 4 KiB read slack is enough).
func NewScreenConn(nc net.Conn, maxHead int) *ScreenConn {
	return &ScreenConn{Conn: nc, maxHead: maxHead}
}

// NetConn returns the screened connection (as tls.Conn.NetConn does).
func (s *ScreenConn) NetConn() net.Conn { return s.Conn }

// Unscreen stops screening: the rest of the stream passes through. It
// returns the connection under the screen if nothing read from it is held
// (the caller may then read it directly); otherwise ok is false and the
// caller goes on reading through the screen.
func (s *ScreenConn) Unscreen() (nc net.Conn, ok bool) {
	if s.cr {
		s.out = append(s.out, '\r')
		s.cr = false
	}
	s.state = screenOpen
	if len(s.out) > 0 || s.aheadR < s.aheadW {
		return nil, false
	}
	return s.Conn, true
}

// Detach takes nc apart for a new owner that reads the socket itself
// (the sidecar's HTTP/2 relay, with raw system calls): it returns what the
// wrappers the keepalive loop put on nc (a ScreenConn, a PrefixConn) hold
// and have not given out, in the order it was read, and the connection
// under them. The wrappers must not be read again.
func Detach(nc net.Conn) (held []byte, under net.Conn) {
	for {
		switch c := nc.(type) {
		case *ScreenConn:
			if c.cr {
				held = append(held, '\r')
				c.cr = false
			}
			held = append(held, c.out...)
			held = append(held, c.ahead[c.aheadR:c.aheadW]...)
			c.out, c.aheadR, c.aheadW = nil, 0, 0
			nc = c.Conn
		case *prefixConn:
			held = append(held, c.prefix...)
			c.prefix = nil
			nc = c.Conn
		default:
			return held, nc
		}
	}
}

// readAhead reads an HTTP/2 connection: from what was read ahead, or, for
// a read smaller than the buffer, as much as the socket has into the
// buffer first. It returns what one read of the socket would have (bytes
// in their order, and the socket's error once nothing is held).
func (s *ScreenConn) readAhead(p []byte) (int, error) {
	if s.aheadR == s.aheadW {
		if err := s.aheadErr; err != nil {
			s.aheadErr = nil
			return 0, err
		}
		if len(p) >= aheadSize {
			return s.Conn.Read(p)
		}
		if s.ahead == nil {
			s.ahead = make([]byte, aheadSize)
		}
		n, err := s.Conn.Read(s.ahead)
		s.aheadR, s.aheadW = 0, n
		if n == 0 {
			return 0, err
		}
		s.aheadErr = err
	}
	n := copy(p, s.ahead[s.aheadR:s.aheadW])
	s.aheadR += n
	return n, nil
}

// Read reads through the screen.
func (s *ScreenConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if len(s.out) > 0 {
			n := copy(p, s.out)
			s.out = s.out[n:]
			return n, nil
		}
		switch s.state {
		case screenOpen:
			if s.h2 {
				return s.readAhead(p)
			}
			return s.Conn.Read(p)
		case screenRefused:
			// net/http closes after its 400; nothing more is its.
			return 0, io.EOF
		}
		if s.cr {
			// The held CR goes before what follows, unless the head is
			// refused: a rare path, through the scratch buffer.
			n, _ := s.Conn.Read(s.scratch[:])
			if n == 0 {
				// The stream ended (or failed) after the CR: it is
				// net/http's to see (the next read repeats the error).
				s.cr = false
				p[0] = '\r'
				return 1, nil
			}
			s.cr = false
			k := s.advance(s.scratch[:n])
			if s.state != screenRefused {
				s.out = append(s.out, '\r')
			}
			s.out = append(s.out, s.scratch[:k]...)
			if s.state == screenRefused {
				s.out = append(s.out, poison...)
			}
			continue
		}
		n, err := s.Conn.Read(p)
		if n == 0 {
			return 0, err
		}
		k := s.advance(p[:n])
		if s.state == screenRefused {
			s.out = append(s.out[:0], poison...)
		}
		if k > 0 {
			return k, nil
		}
		if len(s.out) == 0 && err != nil {
			return 0, err
		}
	}
}

// Write passes p on; while a protocol switch is unanswered, the response's
// status line decides it.
// CloseWrite lets net/http half-close the connection before it waits to
// close one whose request body it left unread: the client then reads the
// answer and EOF instead of losing the answer to the reset that closing
// over unread bytes sends.
func (s *ScreenConn) CloseWrite() error {
	if cw, ok := s.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (s *ScreenConn) Write(p []byte) (int, error) {
	if s.switching.Load() {
		s.mu.Lock()
		if s.upgrade && s.verdict == switchPending && len(p) >= 12 && string(p[:7]) == "HTTP/1." {
			switch {
			case string(p[9:12]) == "101":
				s.verdict = switchDone
			case p[9] != '1':
				s.verdict = switchRefused
			}
		}
		s.mu.Unlock()
	}
	return s.Conn.Write(p)
}

// advance runs the screen over b, just read, and returns how many of its
// bytes may go to the reader: all of them, but for a CR held as the
// possible start of a head's empty line (s.cr), or, when the head is
// refused (s.state), the head's empty line and all after it.
func (s *ScreenConn) advance(b []byte) int {
	i := 0
	for i < len(b) {
		switch s.state {
		case screenOpen:
			return len(b)
		case screenRefused:
			return i
		case screenSwitch:
			s.mu.Lock()
			if s.verdict == switchPending {
				// The client sends before the answer (a tunnel's first
				// bytes, or another request): unscreened.
				s.passed = true
			}
			again := s.verdict == switchRefused && !s.passed
			s.upgrade = false
			s.switching.Store(false)
			s.mu.Unlock()
			if !again {
				// A tunnel, or bytes that passed unscreened: from here
				// on nothing is known to be a head.
				s.state = screenOpen
				return len(b)
			}
			s.state = screenHead
		case screenHead:
			for s.skip > 0 && len(s.head) == 0 && i < len(b) && (b[i] == '\r' || b[i] == '\n') {
				s.skip--
				i++
			}
			if i == len(b) {
				return i
			}
			s.skip = 0
			seg := b[i:]
			j := bytes.IndexByte(seg, '\n')
			if j < 0 {
				s.head = append(s.head, seg...)
				if len(s.head) > s.maxHead {
					s.state = screenOpen // net/http answers 431
					s.head, s.lineStart = s.head[:0], 0
					return len(b)
				}
				if s.lineStart > 0 && len(s.head) == s.lineStart+1 && s.head[s.lineStart] == '\r' {
					s.cr = true // maybe the empty line's start
					return len(b) - 1
				}
				return len(b)
			}
			before := len(s.head) - s.lineStart // of this line, held or given
			if n := before + j; n == 0 || n == 1 && (before == 1 || seg[0] == '\r') {
				// The empty line: the head is complete. It starts at b[i]
				// (or at the held CR before b).
				if s.lineStart == 0 {
					s.state = screenOpen // an empty request line: 400
					s.head = s.head[:0]
					return len(b)
				}
				ok := s.endHead(s.head[:s.lineStart])
				s.head, s.lineStart = s.head[:0], 0
				if !ok {
					return i
				}
				i += j + 1
				continue
			}
			s.head = append(s.head, seg[:j+1]...)
			s.lineStart = len(s.head)
			i += j + 1
			if len(s.head) > s.maxHead {
				s.state = screenOpen
				s.head, s.lineStart = s.head[:0], 0
				return len(b)
			}
		case screenBody, screenChunkData:
			n := int(min(s.left, int64(len(b)-i)))
			s.left -= int64(n)
			i += n
			if s.left == 0 {
				if s.state == screenBody {
					s.next()
				} else {
					s.state = screenChunkEnd
					s.line = s.line[:0]
				}
			}
		case screenChunkEnd:
			s.line = append(s.line, b[i])
			i++
			if len(s.line) == 2 {
				if string(s.line) != "\r\n" {
					s.state = screenOpen // net/http fails the body
					return len(b)
				}
				s.state = screenChunkLine
				s.line = s.line[:0]
			}
		case screenChunkLine, screenTrailer:
			c := b[i]
			i++
			s.line = append(s.line, c)
			if c != '\n' {
				if len(s.line) > 4096 {
					s.state = screenOpen // net/http: line too long
					return len(b)
				}
				continue
			}
			if s.state == screenTrailer {
				if len(s.line) == 1 || len(s.line) == 2 && s.line[0] == '\r' {
					s.next()
				}
				s.line = s.line[:0]
				continue
			}
			size, ok := chunkSize(s.line)
			s.line = s.line[:0]
			switch {
			case !ok:
				s.state = screenOpen // net/http fails the body
				return len(b)
			case size == 0:
				s.state = screenTrailer
			default:
				s.state, s.left = screenChunkData, size
			}
		}
	}
	return i
}

// endHead screens a complete head (without its empty line) and sets the
// state for what follows; false: refused.
func (s *ScreenConn) endHead(head []byte) bool {
	h, err := h1.ScreenHead(head)
	if err != nil {
		s.state = screenRefused
		return false
	}
	s.post = h.Post
	if h.Upgrade {
		s.mu.Lock()
		s.upgrade, s.verdict, s.passed = true, switchPending, false
		s.switching.Store(true)
		s.mu.Unlock()
	}
	if cap(s.head) > 64<<10 {
		s.head = nil // do not keep a huge head's buffer
	}
	switch h.Framing {
	case h1.BodyUnknown:
		s.state = screenOpen
		// What follows HTTP/2's preface is frames: read them ahead.
		s.h2 = string(head) == h2Preface
	case h1.BodyLength:
		s.state, s.left = screenBody, h.Length
	case h1.BodyChunked:
		s.state = screenChunkLine
		s.line = s.line[:0]
	default:
		s.next()
	}
	return true
}

// next is the state after a request's body.
func (s *ScreenConn) next() {
	s.mu.Lock()
	upgrade := s.upgrade
	s.mu.Unlock()
	if upgrade {
		s.state = screenSwitch
		return
	}
	s.state = screenHead
	s.skip = 0
	if s.post {
		s.skip = 4
	}
}

// chunkSize parses a chunk-size line as net/http does: CRLF at the end
// and no other CR, trailing spaces and tabs trimmed, an extension cut at
// ';', 1 to 16 hex digits.
func chunkSize(line []byte) (int64, bool) {
	if len(line) < 2 || line[len(line)-2] != '\r' || bytes.IndexByte(line, '\r') != len(line)-2 {
		return 0, false
	}
	line = line[:len(line)-2]
	if len(line) >= 4096 {
		return 0, false
	}
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 {
		return 0, false
	}
	var n uint64
	for _, c := range line {
		switch {
		case c >= '0' && c <= '9':
			n = n<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			n = n<<4 | uint64(c-'a'+10)
		case c >= 'A' && c <= 'F':
			n = n<<4 | uint64(c-'A'+10)
		default:
			return 0, false
		}
	}
	if n > 1<<62 {
		return 0, false // beyond anything int64 bookkeeping should meet
	}
	return int64(n), true
}

// ScreenListener screens every connection it accepts (see ScreenConn).
type ScreenListener struct {
	net.Listener
	MaxHead int
}

// Accept returns the next connection, screened.
func (l ScreenListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return NewScreenConn(c, l.MaxHead), nil
}
