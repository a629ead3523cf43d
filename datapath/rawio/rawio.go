// Package rawio reads and writes a proxy's TCP connections with raw system
// calls, for the two hot paths every request crosses (the gateway and the
// sidecar).
//
// # Why
//
// A Go read or write on a socket tells the scheduler it is entering a
// system call. On a machine whose cores are shared with the client, the
// app and the other proxy, a loopback write (which runs the receiver's TCP
// input too) is often descheduled inside the kernel; the runtime's monitor
// thread then sees a processor stuck in a system call, hands it to another
// thread, and, having found work, keeps waking every 20 us to look again.
// In the gateway benchmark that monitor alone was 7.5 % of the gateway's
// CPU, before the thread hand-offs it caused.
//
// The sockets are non-blocking, so their reads and writes return at once
// (or with EAGAIN, and then the goroutine waits in the network poller as
// usual): they are exactly the short calls the runtime does not need to be
// told about.
//
// # What
//
// Conn wraps a net.Conn. Its Read and Write are those of the connection,
// with the same deadlines, poller waits and errors (io.EOF,
// os.ErrDeadlineExceeded, net.ErrClosed), but each attempt is a raw system
// call. Where there is no raw socket (a wrapped connection), on platforms
// other than Linux (untested there, and on some the raw call goes through
// a deprecated libc entry) or with the race detector on (it learns of I/O
// ordering from the syscall package's own calls), Conn is the connection
// itself.
package rawio
