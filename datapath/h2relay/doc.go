// Package h2relay is the HTTP/2 relay of issue 44 ("gRPC at HAProxy's
// cost"): the protocol state of one HTTP/2 connection, as a pure state
// machine in the style of etcd's raft, and the relay between connections
// built on it, which replaces net/http's HTTP/2 server and transport in
// the sidecar (for h2c apps) and in the gateway.
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
//
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
//
//   - Writer (writer.go): the connection's Write* actions as frames in one
//     buffer, flushed in one system call per turn (coalescing), with the
//     connection's HPACK encoder (table size from PeerSettings) and header
//     blocks split into CONTINUATION frames at the peer's frame size
//     (PeerMaxFrame). TestWriterCoalescesFrames.
//
//   - Relay (relay.go, group.go, session.go, pool.go, flow.go,
//     relaystream.go): the relay
//     between connections, wired into the sidecar for h2c clients of an
//     h2c app (sidecar/relayhandler.go). Each downstream connection (a
//     session) belongs to one of a few groups (one per P); a group is one
//     lock domain with a pool of upstream connections its sessions'
//     streams share, stream IDs mapped, HPACK per connection. Goroutines:
//     one reader per socket (frames already buffered join the turn of the
//     one that woke it) and a timer per group; none per stream. A turn
//     steps the machines and carries out their actions; its writes leave,
//     one system call per socket, after the lock is released, by the
//     goroutine that claimed them (a socket that takes nothing blocks
//     only that goroutine; MaxBuffered cuts it). Flow control end to end:
//     a client's bytes are credited back only once written upstream and
//     the app's only once written downstream, so a stream holds at most
//     its receive window; upstream the connection window is credited on
//     receipt (Config.CreditConnOnReceipt), so a slow reader holds back
//     its own stream and not the pool. The Handler admits each stream
//     (Proceed, Hold with a later Grant, or its own answer), sets its
//     deadline, maps the app's failures before a response (Failed) and
//     accounts for it (Done, called outside the lock). RST_STREAM passes
//     both ways (the client's as CANCEL), REFUSED_STREAM from the app is
//     retried on another connection when nothing of the body left,
//     trailers pass, GOAWAY drains (Relay.Drain), PINGs are answered.
//     Streams admitted in a turn are opened upstream at its end: one reset
//     in the frames read with its head never reaches the app.
//
//   - Targets, Rewind, Admit (pool.go, relaystream.go): a pool of upstream
//     connections per target (Stream.Target, RelayConfig.Dial's target)
//     in each group, for the gateway, whose streams go to the instances
//     it picks (activator/relay.go); a stream whose upstream side failed
//     before its response can be taken back (Rewind, from Failed or
//     Response: its body replayed from a copy kept up to KeepBody) and
//     opened elsewhere (Open) or later (Admit, from the goroutine that
//     freed a slot). TestRelayTargetsRewindAdmit.
//
//   - The event loop (eploop_linux.go): each group's TCP sockets are read
//     by one epoll loop, not a goroutine each; writes it claims are tried
//     without blocking and finished by a goroutine; a socket closed
//     under it is shut down and closed by the loop.
//
// # What remains (in this order)
//
//  1. Spans on the relay (a traced sidecar keeps net/http's HTTP/2 now),
//     and the probe that waits for readiness (answered at once on the
//     relay; the gateway's waiting probes come over HTTP/1.1).
//  2. make e2e on both pairs (e2e 23 passes through the sidecar's relay;
//     RSS at 1,000 idle connections and 10,000 open streams is in the
//     design notes, loadbench -mode relay-mem).
package h2relay
