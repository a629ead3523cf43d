package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"syscall"
	"time"
)

// A SocketKeeper holds the gateway's listening sockets for a serve that
// may die, as systemd's socket activation does: serve takes them from it
// at every start (over a unix socket, SCM_RIGHTS), so a serve killed with
// SIGKILL leaves the port listening, connections made while it is down wait
// in the kernel's backlog, and the serve Nomad restarts a second later
// accepts them. Only requests the dead process had already taken fail;
// without the keeper every connection until a catalog-driven proxy learns
// the replica is gone is refused.
//
// The keeper is the install job's prestart sidecar task "sockets", in the
// same network namespace as serve. It never accepts a connection itself.
// A serve that stops on purpose shuts its listeners down (shutdownListener):
// that closes the socket the keeper holds too, so the port refuses at once
// as it did without a keeper, and the keeper binds it again for the next
// serve that asks.
type SocketKeeper struct {
	// Path is the unix socket serve asks at (in the allocation directory).
	Path string
	// Listen maps a role (SocketGateway, SocketHTTPS, SocketInternal) to the TCP address
	// to hold for it.
	Listen map[string]string
	// Owner, when not nil, is the user serve runs as, given Path (mode
	// 0600) when the keeper runs as another (root, to bind 443 in
	// docker): connecting to a unix socket takes write permission on it,
	// and only serve should take the gateway's sockets.
	Owner *int
	// Logger gets what the keeper does; nil discards it.
	Logger *slog.Logger

	held map[string]*net.TCPListener
}

// The roles of the sockets a keeper holds.
const (
	SocketGateway  = "gateway"
	SocketHTTPS    = "https"
	SocketInternal = "internal"
)

// socketsMessage is the payload sent with the descriptors: the role of
// each, in the order of the SCM_RIGHTS array.
type socketsMessage struct {
	Roles []string `json:"roles"`
}

// Run binds every address, then hands the listeners to each caller on Path
// until ctx ends. It fails at once when an address cannot be bound (the
// port is taken: say so before serve starts).
func (k *SocketKeeper) Run(ctx context.Context) error {
	log := k.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(k.Listen) == 0 {
		return errors.New("keep sockets: no address to hold")
	}
	k.held = map[string]*net.TCPListener{}
	defer func() {
		for _, l := range k.held {
			l.Close()
		}
	}()
	if err := k.bind(); err != nil {
		return err
	}
	if err := os.Remove(k.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keep sockets: remove the old %s: %w", k.Path, err)
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: k.Path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("keep sockets: listen on %s: %w", k.Path, err)
	}
	defer ul.Close()
	if k.Owner != nil {
		if err := os.Chown(k.Path, *k.Owner, -1); err != nil {
			return fmt.Errorf("keep sockets: give %s to user %d: %w", k.Path, *k.Owner, err)
		}
		if err := os.Chmod(k.Path, 0o600); err != nil {
			return fmt.Errorf("keep sockets: %w", err)
		}
	}
	go func() {
		<-ctx.Done()
		ul.Close()
	}()
	log.Info("holding the gateway's sockets", "path", k.Path, "listen", k.Listen)
	for {
		c, err := ul.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("keep sockets: accept on %s: %w", k.Path, err)
		}
		if err := k.bind(); err != nil {
			// The port is taken: serve hears why (the message's
			// roles are empty) and says it.
			log.Error("bind the gateway's sockets again", "err", err)
		}
		err = k.send(c)
		c.Close()
		if err != nil {
			log.Warn("hand the gateway's sockets to serve", "err", err)
			continue
		}
		log.Info("handed the gateway's sockets to serve")
	}
}

// bind (re)binds every address whose listener is missing or no longer
// listening: a serve that stopped on purpose shut it down.
func (k *SocketKeeper) bind() error {
	for role, addr := range k.Listen {
		if l, ok := k.held[role]; ok {
			if listening(l) {
				continue
			}
			l.Close()
			delete(k.held, role)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("keep sockets: listen for the %s on %s: %w", role, addr, err)
		}
		k.held[role] = l.(*net.TCPListener)
	}
	return nil
}

// send writes the roles and the listeners' descriptors to c.
func (k *SocketKeeper) send(c *net.UnixConn) error {
	var msg socketsMessage
	var fds []int
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	roles := make([]string, 0, len(k.held))
	for role := range k.held {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	for _, role := range roles {
		f, err := k.held[role].File() // a dup; closed above
		if err != nil {
			return fmt.Errorf("descriptor of the %s listener: %w", role, err)
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
		msg.Roles = append(msg.Roles, role)
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("send to %s: %w", c.RemoteAddr(), err)
	}
	return nil
}

// listening reports whether l's socket still accepts connections.
func listening(l *net.TCPListener) bool {
	rc, err := l.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
		ok = err == nil && v == 1
	})
	return ok
}

// takeSockets asks the keeper at path for its listeners, by role. The
// keeper starts before serve (a prestart sidecar), so it waits only a
// little for its socket to appear.
func takeSockets(ctx context.Context, path string) (map[string]net.Listener, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var c *net.UnixConn
	for {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			c = nc.(*net.UnixConn)
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("take the gateway's sockets from the keeper at %s: %w (is the sockets task running? `nomad alloc status` shows it)", path, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf, oob := make([]byte, 4096), make([]byte, syscall.CmsgSpace(4*8))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("take the gateway's sockets from the keeper at %s: %w", path, err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("take the gateway's sockets from %s: %w", path, err)
		}
		for _, m := range msgs {
			got, err := syscall.ParseUnixRights(&m)
			if err != nil {
				return nil, fmt.Errorf("take the gateway's sockets from %s: %w", path, err)
			}
			fds = append(fds, got...)
		}
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("keeper-socket-%d", i))
	}
	defer func() {
		for _, f := range files {
			f.Close() // net.FileListener made its own dup
		}
	}()
	var msg socketsMessage
	if err := json.Unmarshal(buf[:n], &msg); err != nil || len(msg.Roles) != len(files) {
		return nil, fmt.Errorf("take the gateway's sockets from %s: %d descriptors for roles %q (%v): the keeper could not bind them; its log says why", path, len(files), msg.Roles, err)
	}
	out := make(map[string]net.Listener, len(files))
	for i, f := range files {
		l, err := net.FileListener(f)
		if err != nil {
			for _, l := range out {
				l.Close()
			}
			return nil, fmt.Errorf("take the %s socket from %s: %w", msg.Roles[i], path, err)
		}
		out[msg.Roles[i]] = l
	}
	return out, nil
}

// stopListening stops the socket under f listening for every holder of
// it, the keeper included, so the port refuses new connections at once
// (closing serve's descriptor alone would leave the keeper's listening,
// with connections piling up in a backlog nobody accepts from). It closes
// f.
func stopListening(f *os.File) {
	_ = syscall.Shutdown(int(f.Fd()), syscall.SHUT_RDWR)
	f.Close()
}
