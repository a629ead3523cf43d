//go:build darwin || freebsd || netbsd || openbsd

package keepalive

// peerShutdown: without POLLRDHUP a TLS client's close_notify waiting
// unread hides its FIN; the client is noticed as gone when a write to it
// fails, or by the next request's read.
func peerShutdown(uintptr) bool { return false }
