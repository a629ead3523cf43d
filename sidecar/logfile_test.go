package sidecar

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// redirects records which files LogFile made the process's stderr,
// leaving the test binary's own alone.
type redirects struct{ names []string }

func (r *redirects) redirect(f *os.File) error {
	r.names = append(r.names, filepath.Base(f.Name()))
	return nil
}

func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

func TestLogFileRotatesUnderNomadsNamesAndKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	// Another task's logs beside it are never touched.
	if err := os.WriteFile(filepath.Join(dir, "user.stderr.0"), []byte("app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var r redirects
	l, err := openLogFile(base, 3, 10, r.redirect)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"aaaa\n", "bbbb\n", "cccc\n", "a line longer than the bound\n", "dddd\n", "eeee\n", "ffff\n"} {
		if n, err := l.Write([]byte(line)); err != nil || n != len(line) {
			t.Fatalf("Write(%q) = %d, %v", line, n, err)
		}
	}
	got := files(t, dir)
	want := map[string]string{
		"user.stderr.0": "app\n",
		// .0 "aaaa bbbb" and .1 "cccc" removed: three files at most.
		"queue-proxy.stderr.2": "a line longer than the bound\n",
		"queue-proxy.stderr.3": "dddd\neeee\n",
		"queue-proxy.stderr.4": "ffff\n",
	}
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	for name, content := range want {
		if got[name] != content {
			t.Errorf("%s = %q, want %q", name, got[name], content)
		}
	}
	if wantR := []string{"queue-proxy.stderr.0", "queue-proxy.stderr.1", "queue-proxy.stderr.2", "queue-proxy.stderr.3", "queue-proxy.stderr.4"}; !slices.Equal(r.names, wantR) {
		t.Errorf("stderr redirected to %v, want each file in turn %v", r.names, wantR)
	}
	if p := l.Path(); p != base+".4" {
		t.Errorf("Path() = %s", p)
	}
}

func TestLogFileARestartedSidecarAppendsToTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	for name, content := range map[string]string{"queue-proxy.stderr.9": "nine\n", "queue-proxy.stderr.10": "ten\n", "queue-proxy.stderr.x": "not ours\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var r redirects
	l, err := openLogFile(base, 10, 100, r.redirect)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("restarted\n")); err != nil {
		t.Fatal(err)
	}
	if got := files(t, dir)["queue-proxy.stderr.10"]; got != "ten\nrestarted\n" {
		t.Errorf("newest file (10, not 9: numbers, not names) = %q", got)
	}

	// A newest file already at its bound is left for the next.
	full := filepath.Join(t.TempDir(), "queue-proxy.stderr")
	if err := os.WriteFile(full+".0", []byte(strings.Repeat("x", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = openLogFile(full, 10, 100, r.redirect)
	if err != nil {
		t.Fatal(err)
	}
	if p := l.Path(); p != full+".1" {
		t.Errorf("after a full .0 the sidecar writes %s, want .1", p)
	}
}

func TestLogFileRefusesWhatCannotWork(t *testing.T) {
	var r redirects
	dir := t.TempDir()
	for _, c := range []struct {
		name        string
		base        string
		files       int
		bytes       int64
		errContains string
	}{
		{"no path", "", 1, 1, "want a path"},
		{"no files", filepath.Join(dir, "q"), 0, 1, "at least 1 file"},
		{"no bytes", filepath.Join(dir, "q"), 1, 0, "at least 1 file and 1 byte"},
		{"no directory", filepath.Join(dir, "missing", "q"), 1, 1, "sidecar log directory"},
	} {
		if _, err := openLogFile(c.base, c.files, c.bytes, r.redirect); err == nil || !strings.Contains(err.Error(), c.errContains) {
			t.Errorf("%s: err %v, want it to say %q", c.name, err, c.errContains)
		}
	}
}

// A panic's trace, which the runtime writes to file descriptor 2, lands
// in the log file: run in a child process that opens it and panics.
func TestLogFileTakesTheRuntimesStderr(t *testing.T) {
	if base := os.Getenv("SIDECAR_LOGFILE_CHILD"); base != "" {
		l, err := OpenLogFile(base, LogMaxFiles, LogMaxBytes)
		if err != nil {
			os.Exit(3)
		}
		_, _ = l.Write([]byte("a line of ours\n"))
		panic("the sidecar's panic")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLogFileTakesTheRuntimesStderr$")
	cmd.Env = append(os.Environ(), "SIDECAR_LOGFILE_CHILD="+base)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child did not panic: %s", out)
	}
	b, rerr := os.ReadFile(base + ".0")
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, want := range []string{"a line of ours\n", "panic: the sidecar's panic", "goroutine "} {
		if !strings.Contains(string(b), want) {
			t.Errorf("log file lacks %q:\n%s\n(child's own output: %s)", want, b, out)
		}
	}
	if strings.Contains(string(out), "the sidecar's panic") {
		t.Errorf("the panic went to the child's stderr too: %s", out)
	}
}
