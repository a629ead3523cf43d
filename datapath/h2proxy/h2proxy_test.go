package h2proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
)

type closer struct{ n int }

func (c *closer) Close() error { c.n++; return nil }

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("reset") }
func (failing) Close() error             { return nil }

// The client's body is closed once, when the response ends (EOF or an
// error) or is closed, and not before.
func TestEndsRequest(t *testing.T) {
	in := &closer{}
	r := EndsRequest(io.NopCloser(strings.NewReader("abc")), in)
	buf := make([]byte, 2)
	if n, err := r.Read(buf); n != 2 || err != nil || in.n != 0 {
		t.Fatalf("mid-body: %d %v, closed %d times", n, err, in.n)
	}
	if _, err := io.ReadAll(r); err != nil || in.n != 1 {
		t.Fatalf("at the end: %v, closed %d times, want 1", err, in.n)
	}
	if err := r.Close(); err != nil || in.n != 1 {
		t.Fatalf("Close after the end: %v, closed %d times, want 1", err, in.n)
	}

	in = &closer{}
	if _, err := EndsRequest(failing{}, in).Read(buf); err == nil || in.n != 1 {
		t.Fatalf("a failed response: %v, closed %d times, want 1", err, in.n)
	}
	in = &closer{}
	if EndsRequest(io.NopCloser(strings.NewReader("abc")), in).Close(); in.n != 1 {
		t.Fatalf("a response closed unread: closed %d times, want 1", in.n)
	}
}
