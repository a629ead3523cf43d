// Package benchhttp holds the two raw HTTP/1.1 ends of the proxies'
// serving benchmarks: a server that answers every request with the same
// bytes and keep-alive clients that read the answers, neither allocating
// per request, so a benchmark's allocs/op are the proxy's own.
package benchhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"
)

// OK is a small 200 response with a length and a type.
const OK = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"

// Serve listens on 127.0.0.1 and answers every request (a head without a
// body) on every connection with response. It returns the address; the
// listener closes when the benchmark ends.
func Serve(tb testing.TB, response string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	resp := []byte(response)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// Drive sends request to addr from b.RunParallel's goroutines, each on its
// own keep-alive connection, and reads every answer, which must be a 200
// with a Content-Length.
func Drive(b *testing.B, addr, request string) {
	req := []byte(request)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for pb.Next() {
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			if err := readOK(br); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// readOK reads a 200 response with a Content-Length body.
func readOK(br *bufio.Reader) error {
	length := -1
	for first := true; ; first = false {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first {
			if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
				return fmt.Errorf("status line %q", line)
			}
			continue
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			length = 0
			for _, c := range bytes.TrimSpace(v) {
				length = length*10 + int(c-'0')
			}
		}
	}
	if length < 0 {
		return errors.New("no Content-Length")
	}
	_, err := br.Discard(length)
	return err
}
