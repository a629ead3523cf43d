package testbin

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartWaitStop(t *testing.T) {
	port := FreePort(t)
	// A shell that listens is more than this package needs to assume;
	// check the process helpers with sh and a listener of our own.
	p := Start(t, "sh", []string{"-c", "echo started $GREETING; exec sleep 30"}, map[string]string{"GREETING": "hello"})
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p.WaitPort(t, port, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.Output(), "started hello") {
		if time.Now().After(deadline) {
			t.Fatalf("output %q", p.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := p.Stop(t); code != -1 {
		t.Fatalf("exit code %d after SIGTERM, want -1 (signalled)", code)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := WaitPort(FreePort(t), 100*time.Millisecond, nil); err == nil {
		t.Fatal("WaitPort succeeded on a closed port")
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
}
