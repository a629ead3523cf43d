package keepalive

import "golang.org/x/sys/unix"

// peerShutdown reports whether the peer of socket fd has shut its side
// down (POLLRDHUP), even with bytes still waiting to be read, which a
// peek cannot tell.
func peerShutdown(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}
