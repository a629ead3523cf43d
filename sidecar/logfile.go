package sidecar

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Bounds of the sidecar's own log files: Nomad's defaults for a task's
// logs (logs { max_files = 10, max_file_size = 10 }).
const (
	LogMaxFiles = 10
	LogMaxBytes = 10 << 20
)

// LogFile is the sidecar's stderr, kept where Nomad keeps a task's logs,
// for a queue-proxy task whose log collection is off (logs { disabled =
// true } in the compiled job). It writes the files Nomad's logmon would:
// <base>.<n>, base being "<alloc dir>/logs/queue-proxy.stderr", so `nomad
// alloc logs`, Nomad's logs API and `nomad-serverless logs -task
// queue-proxy` read them as before.
//
// Why the sidecar writes its own: with collection on, Nomad starts a
// logmon process (a copy of the whole nomad binary) for the task before
// the task starts, and keeps it for the instance's life. The compiled job
// asks for it under raw_exec only: Nomad 2.0 mounts the logs directory
// read-only into containers and exec chroots. A wake waits for those spawns; on a busy
// two-core node the queue-proxy's alone moved the median first byte of a
// raw_exec wake from 509 to 362 ms (docs/design-notes.md).
//
// It guarantees: the file descriptor 2 of the process is the current file
// (so a panic or a fatal error of the runtime, which writes there, lands in
// it too); a file grows past maxBytes only by the one write that crossed
// it; at most maxFiles files exist, the oldest removed first; a restarted
// sidecar appends to the newest file it finds. Writes are serialized: the
// sidecar logs rarely (starts, drains, probe changes; every request only
// with the access log on), so a mutex costs nothing measurable.
type LogFile struct {
	base     string
	maxFiles int
	maxBytes int64
	// redirect makes fd 2 the given file (dup3); a field so tests can
	// leave the test binary's stderr alone.
	redirect func(*os.File) error

	mu    sync.Mutex
	f     *os.File
	index int
	size  int64
}

// OpenLogFile opens the newest <base>.<n> for appending (or <base>.0) and
// makes it the process's stderr.
func OpenLogFile(base string, maxFiles int, maxBytes int64) (*LogFile, error) {
	return openLogFile(base, maxFiles, maxBytes, redirectStderr)
}

func openLogFile(base string, maxFiles int, maxBytes int64, redirect func(*os.File) error) (*LogFile, error) {
	if base == "" || maxFiles < 1 || maxBytes < 1 {
		return nil, fmt.Errorf("sidecar log file %q: want a path, at least 1 file and 1 byte (got %d files of %d bytes)", base, maxFiles, maxBytes)
	}
	l := &LogFile{base: base, maxFiles: maxFiles, maxBytes: maxBytes, redirect: redirect}
	indexes, err := l.indexes()
	if err != nil {
		return nil, err
	}
	if len(indexes) > 0 {
		l.index = indexes[len(indexes)-1]
	}
	if err := l.open(); err != nil {
		return nil, err
	}
	if l.size >= maxBytes {
		if err := l.rotate(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Write writes p to the current file, first moving on to a new one when p
// would take the current one past its bound (a file holds at least one
// write, however long).
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(p)) > l.maxBytes {
		if err := l.rotate(); err != nil {
			// Keep logging into the old file rather than lose the
			// line: the bound is a budget, not a promise to drop.
			fmt.Fprintf(l.f, "sidecar log: %v\n", err)
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// Path is the file being written.
func (l *LogFile) Path() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.path(l.index)
}

func (l *LogFile) path(i int) string { return l.base + "." + strconv.Itoa(i) }

func (l *LogFile) open() error {
	f, err := os.OpenFile(l.path(l.index), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open sidecar log file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open sidecar log file: %w", err)
	}
	if err := l.redirect(f); err != nil {
		f.Close()
		return fmt.Errorf("make %s the sidecar's stderr: %w", f.Name(), err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.size = f, st.Size()
	return nil
}

func (l *LogFile) rotate() error {
	prev := l.index
	l.index++
	if err := l.open(); err != nil {
		l.index = prev
		return err
	}
	indexes, err := l.indexes()
	if err != nil {
		return err
	}
	var errs []error
	for _, i := range indexes {
		if i <= l.index-l.maxFiles {
			if err := os.Remove(l.path(i)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// indexes are the n of every <base>.<n> in the directory, ascending.
func (l *LogFile) indexes() ([]int, error) {
	entries, err := os.ReadDir(filepath.Dir(l.base))
	if err != nil {
		return nil, fmt.Errorf("sidecar log directory: %w", err)
	}
	prefix := filepath.Base(l.base) + "."
	var out []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
			out = append(out, n)
		}
	}
	// ReadDir sorts by name: "10" before "9".
	slices.Sort(out)
	return out, nil
}
