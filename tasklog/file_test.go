package tasklog

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// redirects records which files File made the process's stderr,
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

func TestFileRotatesUnderNomadsNamesAndKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	// Another task's logs beside it are never touched.
	if err := os.WriteFile(filepath.Join(dir, "user.stderr.0"), []byte("app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var r redirects
	l, err := open(base, 3, 10, r.redirect)
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
		// .0 "aaaa\nbbbb\n", .1 "cccc\n", then the long line cut at
		// the bound over .2 to .4; the three newest kept.
		"queue-proxy.stderr.4": "he bound\n",
		"queue-proxy.stderr.5": "dddd\neeee\n",
		"queue-proxy.stderr.6": "ffff\n",
	}
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	for name, content := range want {
		if got[name] != content {
			t.Errorf("%s = %q, want %q", name, got[name], content)
		}
	}
	var wantR []string
	for i := range 7 {
		wantR = append(wantR, "queue-proxy.stderr."+strconv.Itoa(i))
	}
	if !slices.Equal(r.names, wantR) {
		t.Errorf("stderr redirected to %v, want each file in turn %v", r.names, wantR)
	}
	if _, err := l.Write([]byte("g\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(base + ".6"); string(b) != "ffff\ng\n" {
		t.Errorf("the next line went elsewhere than the newest file, .6: %q", b)
	}
}

func TestFileARestartedSidecarAppendsToTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	for name, content := range map[string]string{"queue-proxy.stderr.9": "nine\n", "queue-proxy.stderr.10": "ten\n", "queue-proxy.stderr.x": "not ours\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var r redirects
	l, err := open(base, 10, 100, r.redirect)
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
	l, err = open(full, 10, 100, r.redirect)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("next\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(full + ".1"); string(b) != "next\n" {
		t.Errorf("after a full .0 the sidecar writes .1: it holds %q", b)
	}
}

func TestFileRefusesWhatCannotWork(t *testing.T) {
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
		{"no directory", filepath.Join(dir, "missing", "q"), 1, 1, "log directory"},
	} {
		if _, err := open(c.base, c.files, c.bytes, r.redirect); err == nil || !strings.Contains(err.Error(), c.errContains) {
			t.Errorf("%s: err %v, want it to say %q", c.name, err, c.errContains)
		}
	}
}

// A panic's trace, which the runtime writes to file descriptor 2, lands
// in the log file: run in a child process that opens it and panics.
func TestFileTakesTheRuntimesStderr(t *testing.T) {
	if base := os.Getenv("TASKLOG_FILE_CHILD"); base != "" {
		l, err := OpenStderr(base, MaxFiles, MaxBytes)
		if err != nil {
			os.Exit(3)
		}
		_, _ = l.Write([]byte("a line of ours\n"))
		panic("the sidecar's panic")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "queue-proxy.stderr")
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileTakesTheRuntimesStderr$")
	cmd.Env = append(os.Environ(), "TASKLOG_FILE_CHILD="+base)
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

// A pump hands over many lines in one write: it is cut after the last
// line that fits, so lines stay whole and the bound holds.
func TestFileCutsAWriteAtALineEnd(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "user.stdout")
	l, err := Open(base, 10, 7)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := l.Write([]byte("aa\nbb\ncc\nddddddddddd\n")); err != nil || n != 21 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	want := map[string]string{"user.stdout.0": "aa\nbb\n", "user.stdout.1": "cc\n", "user.stdout.2": "ddddddd", "user.stdout.3": "dddd\n"}
	got := files(t, dir)
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	for name, content := range want {
		if got[name] != content {
			t.Errorf("%s = %q, want %q", name, got[name], content)
		}
	}
}
