// Package h2relay is the core of the HTTP/2 relay of issue 44 ("gRPC at
// HAProxy's cost"): the protocol state of one HTTP/2 connection, as a pure
// state machine in the style of etcd's raft, for the connection loops that
// will replace net/http's HTTP/2 server and transport in the gateway and
// the sidecar.
//
// # Why a state machine
//
// net/http's HTTP/2 costs a goroutine per stream on each side, channels
// between them, a system call per frame and an allocation per header
// block; the gateway spends about 4x HAProxy's CPU per gRPC call. The
// relay's plan is a loop per connection (or a small fixed number of them)
// that reads frames with x/net's Framer, decides with this package, and
// writes the frames that are ready in one system call. Keeping the
// decisions free of I/O, clocks and goroutines makes every protocol rule a
// table test and lets the fuzzers drive the machine without sockets.
//
// # What is done
//
//   - Next (stream.go): the stream state machine of RFC 9113 §5.1 with
//     HTTP's rules of §8.1 (one head per side, 1xx before it, trailers
//     must end the stream, no DATA before a head), each forbidden event
//     mapped to the stream or connection error the RFC names. Table test
//     TestNextTable; FuzzStreamMachine holds it against an independent
//     model on any sequence of events.
//   - Conn (conn.go): one connection's state, either role: the preface
//     (SETTINGS first), stream IDs (parity, order, reuse), the peer's
//     concurrency limit (REFUSED_STREAM), SETTINGS (validation, the
//     initial window's change applied to open streams with overflow
//     checks, ACK), flow control on both levels and both directions
//     (receive windows spent by DATA with padding, credit returned only
//     through Consumed, once the relay passed the bytes on, in
//     WINDOW_UPDATEs of half a window; send windows that SendData may not
//     exceed, DeliverCredit when the peer grants more), RST_STREAM both
//     ways (DeliverReset tells the other side), GOAWAY both ways
//     (draining with refusal of new streams and a close after the last;
//     streams above a peer's last ID come back as REFUSED_STREAM for the
//     relay to retry), PING (answered; this side's awaited with a
//     timeout), deadlines (per stream, CANCEL both ways; SETTINGS and
//     their ACK; idle), and the floods: control frames (SETTINGS, PING,
//     WINDOW_UPDATE, PRIORITY, empty DATA) and resets (rapid reset) per
//     second, beyond which ENHANCE_YOUR_CALM. CONTINUATION floods and
//     HPACK bombs are the Framer's to stop (MaxHeaderListSize,
//     ReadMetaHeaders); Conn turns its errors into resets or GOAWAY
//     (ReadError). Tests: TestConnServerExchange, TestConnFlowControl,
//     TestConnHostile (test/rawh2's cases against the machine),
//     TestConnGoAway, TestConnTimers; FuzzConn feeds any bytes through a
//     Framer and checks the windows, the stream count and that a closed
//     connection does nothing more.
//   - Writer (writer.go): the connection's Write* actions as frames in one
//     buffer, flushed in one system call per turn (coalescing), with the
//     connection's HPACK encoder (table size from PeerSettings) and header
//     blocks split into CONTINUATION frames at the peer's frame size
//     (PeerMaxFrame). TestWriterCoalescesFrames.
//
// # What remains (in this order)
//
//  1. The connection loop: a goroutine per connection (or per group of
//     connections on a locked thread, as the sidecar's HTTP/1.1 event
//     loops in sidecar/evloop_linux.go) that reads with a Framer
//     (ReadMetaHeaders, MaxHeaderListSize, SetMaxReadFrameSize from
//     Config), calls Step/ReadError/Tick, passes Actions through a Writer
//     (flushed once per turn) and acts on the deliveries it hands back,
//     splits DATA at SendWindow, keeps read-header and idle deadlines on
//     the socket, and reads and checks the client preface before the
//     Framer (bad preface: close).
//  2. The relay between two Conns: stream ID mapping (downstream stream ->
//     upstream stream on a pooled connection), Open on the upstream with
//     the request head (routing, traffic split, concurrency counting and
//     holding at zero stay the gateway's, per stream), DeliverData passed
//     on with SendData only within the upstream's SendWindow and credited
//     back downstream with Consumed only once written (the end-to-end
//     flow control: a slow reader holds its writer back through the
//     windows, no unbounded buffer), DeliverHeaders (responses, 1xx,
//     trailers) passed back with SendHeaders, DeliverReset mapped to Reset
//     on the other side, PeerGoAway retiring a pooled connection
//     (REFUSED_STREAM streams retried on another), deadlines from
//     grpc-timeout and the revision's timeouts through SetDeadline.
//  3. Wiring, behind the hostile table (test/rawh2), FuzzGatewayH2 and the
//     idle and read-header timeout tests: the gateway's h2c and h2
//     listeners and its connections to sidecars, then the sidecar's two
//     sides (client to sidecar, sidecar to an h2c app). Upgrade: h2c and
//     websockets over HTTP/1.1 stay on net/http.
//  4. The measurements: make bench-grpc at 1 stream, 32 streams on one
//     connection and 32 connections against HAProxy (targets: 1.0x
//     calls/s, p99 at most 1.2x, two runs), CPU per call beside
//     HAProxy's, RSS at 1,000 idle connections and 10,000 open streams;
//     the component tests of the issue (grpc-go through gateway and
//     sidecar: unary, streaming, deadlines, cancellation, errors
//     mid-stream, 100 calls at zero, a slow reader with bounded memory);
//     e2e 23 and make e2e on both pairs; the design notes.
//
// Nothing outside this package uses it yet.
package h2relay
