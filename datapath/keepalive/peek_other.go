//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package keepalive

// peekSupported: without a socket peek (MSG_PEEK) a departed client
// could not be noticed, so connections stay with net/http (Supported).
const peekSupported = false

func (c *conn) clientGone() bool { return false }

type clientWatcher struct{}

func (c *conn) watchClient(func()) *clientWatcher { return &clientWatcher{} }

func (w *clientWatcher) stop() {}
