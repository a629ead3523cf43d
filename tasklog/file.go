package tasklog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Nomad's defaults for a task's logs (logs { max_files = 10,
// max_file_size = 10 }): the bounds of the files we write in its place.
const (
	MaxFiles = 10
	MaxBytes = 10 << 20
)

// File is one stream of a task's log (its stdout or its stderr), written
// where Nomad keeps a task's logs and under the names Nomad's logmon
// gives: <base>.<n>, base being "<alloc dir>/logs/<task>.stdout" or
// ".stderr". So `nomad alloc logs`, Nomad's logs API and
// `nomad-serverless logs` read it as any task's.
//
// Why we write a task's log ourselves: with collection on, Nomad starts a
// logmon process (a copy of the whole nomad binary) for every task before
// the task starts, and keeps it for the instance's life. A wake waits for
// that spawn: 110 ms of a raw_exec app's start on a Nomad 2.0.5 client
// (docs/design-notes.md, "Who writes a task's logs"). The compiled job
// turns collection off for the tasks that write their own (raw_exec
// only: Nomad 2.0 mounts the logs directory read-only into containers and
// exec chroots).
//
// It guarantees: no file grows past maxBytes; at most maxFiles files exist, the oldest removed first; a
// restarted task appends to the newest file it finds; with OpenStderr,
// the process's file descriptor 2 is always the current file (so a panic
// or a fatal error of the runtime, which writes there, lands in it too).
// Writes are serialized by a mutex: each stream has one writer (a pump, or
// a logger that logs rarely), so it is never contended.
type File struct {
	base     string
	maxFiles int
	maxBytes int64
	// redirect, when set, makes fd 2 the given file (dup2); a field so
	// tests can leave the test binary's stderr alone.
	redirect func(*os.File) error

	mu    sync.Mutex
	f     *os.File
	index int
	size  int64
}

// Open opens the newest <base>.<n> for appending (or <base>.0).
func Open(base string, maxFiles int, maxBytes int64) (*File, error) {
	return open(base, maxFiles, maxBytes, nil)
}

// OpenStderr is Open, and makes the file the process's stderr from then
// on, across rotations.
func OpenStderr(base string, maxFiles int, maxBytes int64) (*File, error) {
	return open(base, maxFiles, maxBytes, redirectStderr)
}

func open(base string, maxFiles int, maxBytes int64, redirect func(*os.File) error) (*File, error) {
	if base == "" || maxFiles < 1 || maxBytes < 1 {
		return nil, fmt.Errorf("log file %q: want a path, at least 1 file and 1 byte (got %d files of %d bytes)", base, maxFiles, maxBytes)
	}
	l := &File{base: base, maxFiles: maxFiles, maxBytes: maxBytes, redirect: redirect}
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

// Write writes p to the current file, moving on to a new file where p
// would take the current one past its bound. A write is cut after its
// last line end that fits; a file that has room for none of p's lines is
// left for the next, and a line longer than a whole file is cut at the
// bound: Nomad's logmon cuts at the bound alone, but a line whole reads
// better, and the bound holds either way.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	written := 0
	for len(p) > 0 {
		chunk := p
		if room := l.maxBytes - l.size; int64(len(p)) > room {
			i := -1
			if room > 0 {
				i = bytes.LastIndexByte(p[:room], '\n')
			}
			switch {
			case i >= 0:
				chunk = p[:i+1]
			case l.size == 0:
				chunk = p[:l.maxBytes]
			default:
				if err := l.rotate(); err != nil {
					// Keep logging into the old file rather than
					// lose the line: the bound is a budget, not a
					// promise to drop.
					fmt.Fprintf(l.f, "log file: %v\n", err)
					n, werr := l.f.Write(p)
					l.size += int64(n)
					return written + n, werr
				}
				continue
			}
		}
		n, err := l.f.Write(chunk)
		l.size += int64(n)
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (l *File) path(i int) string { return l.base + "." + strconv.Itoa(i) }

func (l *File) open() error {
	f, err := os.OpenFile(l.path(l.index), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open log file: %w", err)
	}
	if l.redirect != nil {
		if err := l.redirect(f); err != nil {
			f.Close()
			return fmt.Errorf("make %s the process's stderr: %w", f.Name(), err)
		}
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.size = f, st.Size()
	return nil
}

func (l *File) rotate() error {
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
func (l *File) indexes() ([]int, error) {
	entries, err := os.ReadDir(filepath.Dir(l.base))
	if err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
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
