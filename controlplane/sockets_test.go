package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The keeper's socket outlives the serve that took it: a connection made
// while no serve runs waits and the next serve accepts it; a serve that
// stops on purpose makes the port refuse, and the keeper binds it again for
// the next one.
func TestSocketKeeperOutlivesServe(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testbin.FreePort(t))
	k := &SocketKeeper{Path: filepath.Join(t.TempDir(), "sockets.sock"), Listen: map[string]string{SocketGateway: addr}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	}()

	take := func() net.Listener {
		t.Helper()
		held, err := takeSockets(ctx, k.Path)
		if err != nil {
			t.Fatal(err)
		}
		if len(held) != 1 || held[SocketGateway] == nil || held[SocketGateway].Addr().String() != addr {
			t.Fatalf("took %v, want the gateway on %s", held, addr)
		}
		return held[SocketGateway]
	}
	roundTrip := func(l net.Listener, c net.Conn) {
		t.Helper()
		go func() {
			s, err := l.Accept()
			if err != nil {
				return
			}
			defer s.Close()
			b := make([]byte, 4)
			if _, err := io.ReadFull(s, b); err == nil {
				s.Write(b)
			}
		}()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
			t.Fatalf("echo: %q %v", b, err)
		}
	}

	first := take()
	c1, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(first, c1)
	c1.Close()

	// serve dies (SIGKILL closes its descriptors and nothing more): the
	// port still takes connections, and the next serve answers them.
	first.Close()
	waiting, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("a connection while no serve runs: %v (the keeper should hold the port)", err)
	}
	defer waiting.Close()
	second := take()
	roundTrip(second, waiting)

	// serve stops on purpose: the port refuses at once, for the keeper too.
	ls := &listeners{gateway: second}
	f, err := second.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ls.kept = []*os.File{f}
	ls.stopKept()
	second.Close()
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("after a serve stopped on purpose, dial = %v, want connection refused", err)
	}
	// The next serve gets the port again.
	third := take()
	defer third.Close()
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	roundTrip(third, c3)
}

// A serve whose keeper holds no HTTPS socket says so, and one without a
// keeper says where it looked.
func TestListenFromAKeeperSaysWhatIsMissing(t *testing.T) {
	k := &SocketKeeper{Path: filepath.Join(t.TempDir(), "sockets.sock"), Listen: map[string]string{SocketGateway: "127.0.0.1:0"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	_, err := listen(ctx, Config{Sockets: k.Path, AdminListen: "127.0.0.1:0", HTTPS: HTTPS{Listen: "127.0.0.1:0"}})
	if err == nil || !strings.Contains(err.Error(), "holds no HTTPS socket") {
		t.Errorf("listen = %v, want it to say the keeper holds no HTTPS socket", err)
	}
	short, shortCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer shortCancel()
	_, err = takeSockets(short, filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "is the sockets task running?") {
		t.Errorf("takeSockets with no keeper = %v", err)
	}
}

// A keeper running as root (to bind 443 in docker) gives its socket to
// serve's user, and to nobody else.
func TestSocketKeeperGivesItsSocketToServesUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	uid := 65532
	k := &SocketKeeper{Path: filepath.Join(t.TempDir(), "sockets.sock"), Listen: map[string]string{SocketGateway: "127.0.0.1:0"}, Owner: &uid}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	held, err := takeSockets(ctx, k.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range held {
		l.Close()
	}
	fi, err := os.Stat(k.Path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket owner %d mode %v, want %d and 0600", st.Uid, fi.Mode().Perm(), uid)
	}
}
