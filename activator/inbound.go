package activator

import (
	"io"
	"sync"
)

// endsInbound is an instance's response body that closes the client's
// HTTP/2 request body when it ends, cleanly or not.
//
// Why: an app may finish a call while its client is still sending (a gRPC
// server returning a status in the middle of a bidirectional stream). The
// HTTP/2 transport's Close of that response body waits for its goroutine
// copying the request body, which is blocked reading the client's body
// (replayBody.read holds that read; ReverseProxy's and the views' Close do
// nothing), so the status and trailers waited for the client's next
// message or for the request timeout (golang/go#80085). Once the
// instance's response has ended, nothing more of the request can reach it:
// closing the client's body then frees the copy at once. An HTTP/2
// server's request body may be closed while another goroutine reads it
// (an HTTP/1 one may not: its Close waits for the read).
type endsInbound struct {
	io.ReadCloser
	in   io.Closer
	once sync.Once
}

func (b *endsInbound) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(func() { b.in.Close() })
	}
	return n, err
}

func (b *endsInbound) Close() error {
	b.once.Do(func() { b.in.Close() })
	return b.ReadCloser.Close()
}
