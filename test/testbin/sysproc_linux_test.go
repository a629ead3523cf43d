//go:build linux

package testbin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperPIDFile, set, makes TestDiesWithTheTestHelper start a process and
// write its PID there.
const helperPIDFile = "TESTBIN_HELPER_PID_FILE"

// TestDiesWithTheTestHelper is not a test: run by TestStartedProcessDiesWithTheTest
// in a process of its own, it starts `sleep` with Start and waits to be
// killed; in a normal run it returns at once.
func TestDiesWithTheTestHelper(t *testing.T) {
	path := os.Getenv(helperPIDFile)
	if path == "" {
		return
	}
	p := Start(t, "sleep", []string{"60"}, nil)
	if err := os.WriteFile(path, []byte(strconv.Itoa(p.PID())), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
}

// A test binary that dies (a panic, -timeout, a kill) runs no cleanup: what
// Start started must go with it anyway.
func TestStartedProcessDiesWithTheTest(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	helper := exec.Command(os.Args[0], "-test.run=^TestDiesWithTheTestHelper$", "-test.timeout=2m")
	helper.Env = append(os.Environ(), helperPIDFile+"="+pidFile)
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		helper.Wait()
		close(done)
	}()
	defer func() {
		helper.Process.Kill()
		<-done
	}()
	var pid int
	Eventually(t, 30*time.Second, 10*time.Millisecond, "the helper starts sleep", func() (bool, string) {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0, "no PID yet"
	})
	if !alive(pid) {
		t.Fatalf("sleep (pid %d) is not running", pid)
	}
	defer syscall.Kill(pid, syscall.SIGKILL) // should this test fail
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	Eventually(t, 10*time.Second, 10*time.Millisecond, "sleep goes with the test process that started it", func() (bool, string) {
		return !alive(pid), "sleep still runs"
	})
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}
