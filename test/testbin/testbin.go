// Package testbin gives component and e2e tests the real nomad-serverless
// binary and a few helpers to run it: Path builds the binary once per test
// process (Program any other main package of the module, such as a test
// app); Start runs a process whose end is registered in t.Cleanup;
// FreePort picks ports outside the ephemeral range and WaitPort waits for
// one on 127.0.0.1; Eventually polls a condition (Bound scales its bound)
// and Buffer collects output written concurrently.
//
// Set NOMAD_SERVERLESS_TEST_BIN to a prebuilt binary to skip the build.
package testbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// EnvBin names a prebuilt binary to use instead of building one.
const EnvBin = "NOMAD_SERVERLESS_TEST_BIN"

// dirPrefix starts the temporary directory each test process builds into;
// its name ends with the builder's PID so a later run can remove the ones
// whose process is gone.
const dirPrefix = "nomad-serverless-testbin-"

// builds are the builds of a test process, one per main package. They are
// the package's only process-wide state, which is what "once per test
// process" means.
var builds struct {
	mu    sync.Mutex
	byPkg map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// binaryPackage is the main package of the binary that ships.
const binaryPackage = "./cmd/nomad-serverless"

// Path returns the path of a nomad-serverless binary built from
// ./cmd/nomad-serverless, building it on the first call of the test process
// (or the binary EnvBin names). The build fails the test (not the process)
// with go build's output.
func Path(tb testing.TB) string {
	tb.Helper()
	return Program(tb, binaryPackage)
}

// Program returns the path of the main package pkg of the module (a path
// relative to its root, such as "./test/grpcapp/cmd/grpcapp"), built on the
// first call of the test process for that package. A test app that must
// not link into the shipped binary (it would grow it) is built this way.
func Program(tb testing.TB, pkg string) string {
	tb.Helper()
	builds.mu.Lock()
	if builds.byPkg == nil {
		builds.byPkg = map[string]*build{}
	}
	b := builds.byPkg[pkg]
	if b == nil {
		b = &build{}
		builds.byPkg[pkg] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() { b.path, b.err = buildBinary(pkg) })
	if b.err != nil {
		tb.Fatalf("testbin: %v", b.err)
	}
	return b.path
}

func buildBinary(pkg string) (string, error) {
	if p := os.Getenv(EnvBin); p != "" && pkg == binaryPackage {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBin, p, err)
		}
		return p, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	removeStaleDirs()
	dir := filepath.Join(os.TempDir(), dirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("make build directory: %w", err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %v\n%s", pkg, root, err, b)
	}
	return out, nil
}

// removeStaleDirs deletes build directories left by test processes that
// have exited (a test binary has no hook to remove its own at exit).
func removeStaleDirs() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, m := range matches {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), dirPrefix))
		if err != nil || pid == os.Getpid() {
			continue
		}
		// Signal 0 checks existence; ESRCH means the process is gone.
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(m)
		}
	}
}

// ModuleRoot walks up from the working directory to the directory holding
// go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
