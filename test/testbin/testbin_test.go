package testbin

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
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

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventually(t *testing.T) {
	calls := 0
	took := Eventually(t, 5*time.Second, time.Millisecond, "three calls", func() (bool, string) {
		calls++
		return calls == 3, ""
	})
	if calls != 3 || took <= 0 {
		t.Errorf("Eventually returned after %d calls, %s", calls, took)
	}

	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(rec, 50*time.Millisecond, 5*time.Millisecond, "never", func() (bool, string) { return false, "still no" })
		t.Error("Eventually returned on a condition that never holds")
	}()
	<-done
	if rec.msg != "never: not within 50ms; last state: still no" {
		t.Errorf("failure message %q", rec.msg)
	}

	var b Buffer
	fmt.Fprint(&b, "a")
	fmt.Fprint(&b, "b")
	if b.String() != "ab" {
		t.Errorf("Buffer = %q", b.String())
	}
}

// FreePort's ports lie outside the kernel's ephemeral range (no outgoing
// connection takes them meanwhile) and Nomad's dynamic ports (no sidecar
// is given them), differ within a process, and are free.
func TestFreePort(t *testing.T) {
	lo, hi := DynamicPorts()
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("port %d: outside [%d, %d) or handed out twice", p, lo, hi)
		}
		seen[p] = true
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(b), &elo, &ehi); err == nil && lo <= ehi && hi > elo {
			t.Errorf("range [%d, %d) overlaps the ephemeral range %d-%d", lo, hi, elo, ehi)
		}
	}
	if lo < 32000 && hi > 20000 {
		t.Errorf("range [%d, %d) overlaps Nomad's dynamic ports 20000-31999", lo, hi)
	}
}
