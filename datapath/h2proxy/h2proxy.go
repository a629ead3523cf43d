// Package h2proxy holds what the gateway's and the sidecar's
// httputil.ReverseProxy paths need for HTTP/2 clients beyond the standard
// library: for now, a response that ends its client's request body.
package h2proxy

import (
	"io"
	"sync"
)

// EndsRequest returns resp, an upstream's response body, such that its
// end, clean or not, closes in, the request body of the HTTP/2 client it
// answers.
//
// Why: an upstream may finish a call while its client is still sending (a
// gRPC server returning a status in the middle of a bidirectional stream).
// The HTTP/2 transport's Close of that response body waits for its
// goroutine copying the request body, which is blocked reading the
// client's body, and ReverseProxy hides that body behind a Close that does
// nothing; so the status and trailers waited for the client's next message
// or for the request's timeout (golang/go#80085). Once the upstream's
// response has ended, nothing more of the request can reach it: closing
// the client's body then frees the copy at once.
//
// in must be an HTTP/2 server's request body, which may be closed while
// another goroutine reads it; an HTTP/1 one may not (its Close waits for
// the read).
func EndsRequest(resp io.ReadCloser, in io.Closer) io.ReadCloser {
	return &endsRequest{ReadCloser: resp, in: in}
}

type endsRequest struct {
	io.ReadCloser
	in   io.Closer
	once sync.Once
}

func (b *endsRequest) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(func() { b.in.Close() })
	}
	return n, err
}

func (b *endsRequest) Close() error {
	b.once.Do(func() { b.in.Close() })
	return b.ReadCloser.Close()
}
