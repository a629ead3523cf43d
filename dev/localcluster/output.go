package localcluster

import (
	"bytes"
	"io"
	"sync"
)

// lineWriter prefixes every complete line with its instance and role and
// writes it under a lock shared by all processes, so lines never interleave.
type lineWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i+1])
		l.buf = l.buf[i+1:]
	}
	// A runaway line without newline is cut rather than buffered forever.
	if len(l.buf) > 64<<10 {
		l.emit(append(l.buf, '\n'))
		l.buf = nil
	}
	return len(p), nil
}

// Flush writes a last partial line.
func (l *lineWriter) Flush() error {
	if len(l.buf) > 0 {
		l.emit(append(l.buf, '\n'))
		l.buf = nil
	}
	return nil
}

func (l *lineWriter) emit(line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, l.prefix)
	_, _ = l.w.Write(line)
}
