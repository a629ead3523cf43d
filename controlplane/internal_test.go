package controlplane

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The internal listener is registered at its own host, or at the replica's
// advertised address when it listens on every interface.
func TestInternalAddress(t *testing.T) {
	for _, tc := range []struct{ listen, want string }{
		{"10.1.0.5:8082", "10.1.0.5"},
		{":8082", "10.0.0.5"},
		{"0.0.0.0:8082", "10.0.0.5"},
		{"[::]:8082", "10.0.0.5"},
		{"[fd00::5]:8082", "fd00::5"},
	} {
		if got := internalAddress(tc.listen, "10.0.0.5"); got != tc.want {
			t.Errorf("internalAddress(%q) = %q, want %q", tc.listen, got, tc.want)
		}
	}
}

// serve takes the internal listener's socket from the keeper as the
// others, and says so when the keeper does not hold one.
func TestListenTakesTheInternalSocketFromTheKeeper(t *testing.T) {
	k := &SocketKeeper{Path: filepath.Join(t.TempDir(), "sockets.sock"),
		Listen: map[string]string{SocketGateway: "127.0.0.1:0", SocketInternal: "127.0.0.1:0"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	ls, err := listen(ctx, Config{Sockets: k.Path, AdminListen: "127.0.0.1:0", InternalListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if ls.internalPort() == 0 || ls.internalPort() == ls.gatewayPort() {
		t.Errorf("internal port %d, gateway port %d: want the keeper's internal socket", ls.internalPort(), ls.gatewayPort())
	}
	ls.close()

	only := &SocketKeeper{Path: filepath.Join(t.TempDir(), "gw.sock"), Listen: map[string]string{SocketGateway: "127.0.0.1:0"}}
	done2 := make(chan error, 1)
	go func() { done2 <- only.Run(ctx) }()
	defer func() { cancel(); <-done2 }()
	_, err = listen(ctx, Config{Sockets: only.Path, AdminListen: "127.0.0.1:0", InternalListen: "127.0.0.1:8082"})
	if err == nil || !strings.Contains(err.Error(), "-internal-listen 127.0.0.1:8082") {
		t.Errorf("listen = %v, want it to say the keeper holds no internal socket", err)
	}
}
