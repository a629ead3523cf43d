//go:build linux

package devagents

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// fakeIP writes an `ip` that records its arguments in calls and refuses to
// add refuse ("RTNETLINK answers: File exists", as ip says), so the
// keeper runs without root and without touching lo.
func fakeIP(t *testing.T, refuse string) (bin, calls string) {
	t.Helper()
	dir := t.TempDir()
	bin, calls = filepath.Join(dir, "ip"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\n" +
		"if [ \"$1 $2 $3\" = \"addr add " + refuse + "\" ]; then echo 'RTNETLINK answers: File exists' >&2; exit 2; fi\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, calls
}

func readCalls(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestLoopbackAddsAndRemoves(t *testing.T) {
	bin, calls := fakeIP(t, "none")
	addrs, _ := NodeAddrs(DefaultFirstNodeAddr(), 2)
	l, err := HoldLoopback(bin, filepath.Join(t.TempDir(), "keeper.log"), addrs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readCalls(t, calls); strings.Join(got, "|") != "addr add 127.0.0.2/32 dev lo|addr add 127.0.0.3/32 dev lo" {
		t.Errorf("while held, ip was called %q", got)
	}
	if err := l.Release(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	want := "addr add 127.0.0.2/32 dev lo|addr add 127.0.0.3/32 dev lo|addr del 127.0.0.2/32 dev lo|addr del 127.0.0.3/32 dev lo"
	if got := readCalls(t, calls); strings.Join(got, "|") != want {
		t.Errorf("after Release, ip was called %q, want %q", got, want)
	}
	if err := l.Release(time.Second); err != nil {
		t.Errorf("a second Release: %v", err)
	}
}

// An address ip refuses is not removed (it may be someone else's); the
// ones added before it are, and the error says what to do.
func TestLoopbackRefusedAddress(t *testing.T) {
	bin, calls := fakeIP(t, "127.0.0.3/32")
	addrs, _ := NodeAddrs(DefaultFirstNodeAddr(), 3)
	_, err := HoldLoopback(bin, filepath.Join(t.TempDir(), "keeper.log"), addrs, nil)
	if err == nil || !strings.Contains(err.Error(), "File exists") || !strings.Contains(err.Error(), "127.0.0.3 is already on lo") {
		t.Fatalf("err = %v", err)
	}
	want := "addr add 127.0.0.2/32 dev lo|addr add 127.0.0.3/32 dev lo|addr del 127.0.0.2/32 dev lo"
	if got := readCalls(t, calls); strings.Join(got, "|") != want {
		t.Errorf("ip was called %q, want %q", got, want)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a\040b/secrets`: "/tmp/a b/secrets",
		`/tmp/plain`:          "/tmp/plain",
		`/tmp/back\134slash`:  `/tmp/back\slash`,
		`/tmp/short\04`:       `/tmp/short\04`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// loopbackHelperEnv makes TestLoopbackHelperProcess hold two addresses with
// the fake ip it names and then SIGKILL itself.
const loopbackHelperEnv = "DEVAGENTS_LOOPBACK_HELPER_IP"

// TestLoopbackHelperProcess is not a test: it is the process that holds
// addresses and dies in TestLoopbackOutlivesAKill.
func TestLoopbackHelperProcess(t *testing.T) {
	bin := os.Getenv(loopbackHelperEnv)
	if bin == "" {
		return
	}
	addrs, _ := NodeAddrs(DefaultFirstNodeAddr(), 2)
	if _, err := HoldLoopback(bin, filepath.Join(filepath.Dir(bin), "keeper.log"), addrs, nil); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// The addresses go even when the process holding them is killed: the
// keeper's end of the pipe reaches end of file.
func TestLoopbackOutlivesAKill(t *testing.T) {
	bin, calls := fakeIP(t, "none")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoopbackHelperProcess$")
	cmd.Env = append(os.Environ(), loopbackHelperEnv+"="+bin)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the helper did not die of SIGKILL: %v\n%s", err, out)
	}
	want := "addr add 127.0.0.2/32 dev lo|addr add 127.0.0.3/32 dev lo|addr del 127.0.0.2/32 dev lo|addr del 127.0.0.3/32 dev lo"
	testbin.Eventually(t, 30*time.Second, 20*time.Millisecond, "the keeper removes both addresses", func() (bool, string) {
		got := strings.Join(readCalls(t, calls), "|")
		return got == want, got
	})
}
