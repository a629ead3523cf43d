package rollout

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fakeLogs is a LogSource whose logs the test writes: each allocation's log
// is a channel of chunks, ended by closing it.
type fakeLogs struct {
	mu     sync.Mutex
	revs   []nomadjob.RevisionStatus
	allocs map[string][]nomadjob.Allocation
	chunks map[string]chan string
	reqs   chan nomadjob.LogRequest // every Logs call, as it starts
}

func newFakeLogs(revs ...nomadjob.RevisionStatus) *fakeLogs {
	return &fakeLogs{revs: revs, allocs: map[string][]nomadjob.Allocation{}, chunks: map[string]chan string{}, reqs: make(chan nomadjob.LogRequest, 16)}
}

func (f *fakeLogs) addAlloc(rev, id string, created time.Time) chan string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs[rev] = append(f.allocs[rev], nomadjob.Allocation{ID: id, Revision: rev, ClientStatus: "running", DesiredStatus: "run", Running: true, Created: created})
	ch := make(chan string, 16)
	f.chunks[id] = ch
	return ch
}

func (f *fakeLogs) Revisions(_ context.Context, _, _ string) ([]nomadjob.RevisionStatus, error) {
	return f.revs, nil
}

func (f *fakeLogs) Allocations(_ context.Context, rev string) ([]nomadjob.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]nomadjob.Allocation(nil), f.allocs[rev]...), nil
}

func (f *fakeLogs) Logs(ctx context.Context, _ string, req nomadjob.LogRequest, fn func([]byte) error) error {
	f.mu.Lock()
	ch := f.chunks[req.Alloc]
	f.mu.Unlock()
	f.reqs <- req
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c, ok := <-ch:
			if !ok {
				return nil
			}
			if err := fn([]byte(c)); err != nil {
				return err
			}
		}
	}
}

func rev(name string, desired int) nomadjob.RevisionStatus {
	r := nomadjob.RevisionStatus{Desired: desired}
	r.Name = name
	return r
}

// syncBuffer is a bytes.Buffer safe for the run's goroutines, which a test
// can wait on for some text.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced on every write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	return s.b.Write(p)
}

// waitFor returns once the buffer holds text (bounded by go test -timeout).
func (s *syncBuffer) waitFor(text string) {
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String(), text) {
			s.mu.Unlock()
			return
		}
		if s.written == nil {
			s.written = make(chan struct{})
		}
		w := s.written
		s.mu.Unlock()
		<-w
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newLogsRun(src LogSource, out, msg *syncBuffer) *Logs {
	return &Logs{
		Src: src, Out: out, Msg: msg, Namespace: "default", Service: "hello",
		Task: spec.UserTaskName, Since: time.Minute, Now: func() time.Time { return t0 },
		Wait: func(ctx context.Context) bool { <-ctx.Done(); return false },
	}
}

// A revision at zero: logs says there is nothing to show and why, and
// reads no log (it has nothing that could wake the revision).
func TestLogsAtZero(t *testing.T) {
	src := newFakeLogs(rev("hello-00001", 0))
	var out, msg syncBuffer
	if err := newLogsRun(src, &out, &msg).Run(context.Background()); err != ErrFailed {
		t.Errorf("Run: %v, want ErrFailed", err)
	}
	for _, want := range []string{"no instance of hello is running", "hello-00001 is at zero", "logs does not wake it"} {
		if !strings.Contains(msg.String(), want) {
			t.Errorf("message lacks %q:\n%s", want, msg.String())
		}
	}
	if out.String() != "" || len(src.reqs) != 0 {
		t.Errorf("printed %q, read %d logs", out.String(), len(src.reqs))
	}
}

// Two instances: their lines come out whole, each prefixed with its
// allocation, however Nomad cut the data; with -follow=false logs ends when
// the logs do.
func TestLogsInterleavesWholeLines(t *testing.T) {
	src := newFakeLogs(rev("hello-00001", 2))
	a := src.addAlloc("hello-00001", "aaaaaaaa-1111", t0.Add(-time.Hour))
	b := src.addAlloc("hello-00001", "bbbbbbbb-2222", t0.Add(-time.Minute))
	a <- "one\ntw"
	a <- "o\nthree"
	b <- "uno\r\n"
	close(a)
	close(b)
	var out, msg syncBuffer
	l := newLogsRun(src, &out, &msg)
	if err := l.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v: %s", err, msg.String())
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	var fromA []string
	for _, line := range got {
		if strings.HasPrefix(line, "[aaaaaaaa] ") {
			fromA = append(fromA, line)
		}
	}
	if strings.Join(fromA, "|") != "[aaaaaaaa] one|[aaaaaaaa] two|[aaaaaaaa] three" || len(got) != 4 || !strings.Contains(out.String(), "[bbbbbbbb] uno\n") {
		t.Errorf("output:\n%s", out.String())
	}
	close(src.reqs)
	for req := range src.reqs {
		if req.Task != spec.UserTaskName || req.Stderr || req.Follow || !req.Since.Equal(t0.Add(-time.Minute)) || req.MaxHistory != LogsMaxHistory {
			t.Errorf("request %+v", req)
		}
	}
	if !strings.Contains(msg.String(), "following hello-00001 aaaaaaaa, hello-00001 bbbbbbbb (task user, stdout)") {
		t.Errorf("message:\n%s", msg.String())
	}
}

// Following: an instance that starts later is followed from its start,
// and the revision is named once there are several.
func TestLogsFollowsNewInstances(t *testing.T) {
	src := newFakeLogs(rev("hello-00001", 1), rev("hello-00002", 0))
	a := src.addAlloc("hello-00001", "aaaaaaaa-1111", t0.Add(-time.Hour))
	tick := make(chan struct{})
	var out, msg syncBuffer
	l := newLogsRun(src, &out, &msg)
	l.Follow, l.Task, l.Stderr = true, spec.SidecarTaskName, true
	l.Wait = func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()

	if req := <-src.reqs; req.Alloc != "aaaaaaaa-1111" || req.Task != spec.SidecarTaskName || !req.Stderr || !req.Follow {
		t.Errorf("first request %+v", req)
	}
	a <- "from a\n"
	created := t0.Add(5 * time.Second)
	b := src.addAlloc("hello-00002", "bbbbbbbb-2222", created)
	tick <- struct{}{}
	if req := <-src.reqs; req.Alloc != "bbbbbbbb-2222" || !req.Since.Equal(created) {
		t.Errorf("request for the new instance %+v", req)
	}
	b <- "from b\n"
	close(b) // b stops
	msg.waitFor("instance bbbbbbbb of hello-00002 stopped")
	out.waitFor("from a\n")
	tick <- struct{}{}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	for _, want := range []string{"[hello-00001 aaaaaaaa] from a\n", "[hello-00002 bbbbbbbb] from b\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, want := range []string{"new instance: hello-00002 bbbbbbbb (task queue-proxy, stderr)", "instance bbbbbbbb of hello-00002 stopped"} {
		if !strings.Contains(msg.String(), want) {
			t.Errorf("message lacks %q:\n%s", want, msg.String())
		}
	}
}

func TestLogsUnknownRevision(t *testing.T) {
	src := newFakeLogs(rev("hello-00001", 1), rev("hello-00002", 1))
	var out, msg syncBuffer
	l := newLogsRun(src, &out, &msg)
	l.Revision = "other-00001"
	if err := l.Run(context.Background()); err != ErrFailed || !strings.Contains(msg.String(), "other-00001 is not a revision of service hello (its revisions: hello-00001, hello-00002)") {
		t.Errorf("Run: %v: %s", err, msg.String())
	}
}
