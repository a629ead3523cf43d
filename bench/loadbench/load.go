package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// Target is what a load run sends: one HTTP/1.1 GET, repeated on keep-alive
// connections. The request bytes are rendered once, so the generator costs
// little CPU per request: on a 2-core machine whatever the generator burns is
// taken from the system under test.
type Target struct {
	Name string
	Addr string // host:port to connect to
	Path string // request target, default "/"
	Host string // Host header, default Addr
	// TLS, when set, makes every connection a TLS client's (tls.go).
	TLS *tls.Config
}

func (t Target) request() []byte {
	path, host := t.Path, t.Host
	if path == "" {
		path = "/"
	}
	if host == "" {
		host = t.Addr
	}
	return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: loadbench\r\n\r\n", path, host)
}

// Load is how hard and how long to push.
type Load struct {
	Conns    int
	Duration time.Duration
	// Timeout bounds one request; a request that takes longer counts as an
	// error and its connection is replaced.
	Timeout time.Duration
	// NewConnEach closes the connection after every response, so every
	// request pays a connection (and a TLS handshake) of its own.
	NewConnEach bool
}

// Result is what one load run measured.
type Result struct {
	Target   string
	Conns    int
	Elapsed  time.Duration
	Requests int64 // responses received (any status) before the end
	Errors   int64 // connection or protocol errors, timeouts
	// Sent counts every request written, including those answered after
	// the end (not in Requests): what the server under test saw.
	Sent int64
	// ByClass counts responses by status class: ByClass[2] is 2xx.
	ByClass [6]int64
	Latency Histogram
}

// RPS is responses per second.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Run drives target with load.Conns connections, each sending the next
// request as soon as the previous response has been read (closed loop),
// for load.Duration.
func Run(ctx context.Context, target Target, load Load) *Result {
	if load.Conns < 1 {
		load.Conns = 1
	}
	if load.Timeout <= 0 {
		load.Timeout = 10 * time.Second
	}
	req := target.request()
	start := time.Now()
	end := start.Add(load.Duration)
	results := make([]*Result, load.Conns)
	var wg sync.WaitGroup
	for i := range results {
		r := &Result{}
		results[i] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			drive(ctx, target, req, end, load, r)
		}()
	}
	wg.Wait()
	total := &Result{Target: target.Name, Conns: load.Conns, Elapsed: time.Since(start)}
	if e := end.Sub(start); total.Elapsed > e {
		// Requests finishing after the end are not counted, so the
		// interval is the planned one.
		total.Elapsed = e
	}
	for _, r := range results {
		total.Requests += r.Requests
		total.Errors += r.Errors
		total.Sent += r.Sent
		for i := range r.ByClass {
			total.ByClass[i] += r.ByClass[i]
		}
		total.Latency.Merge(&r.Latency)
	}
	return total
}

// drive is one connection's closed loop.
func drive(ctx context.Context, target Target, req []byte, end time.Time, load Load, r *Result) {
	addr, timeout := target.Addr, load.Timeout
	var (
		conn net.Conn
		br   *bufio.Reader
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", addr, timeout)
			if err != nil {
				r.Errors++
				// Do not spin on a refused port.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			conn = c
			// One deadline for the connection's whole life: setting one
			// per request would cost a timer update each.
			_ = conn.SetDeadline(end.Add(timeout))
			if target.TLS != nil {
				tc := tls.Client(c, target.TLS)
				if err := tc.HandshakeContext(ctx); err != nil {
					r.Errors++
					c.Close()
					conn = nil
					continue
				}
				conn = tc
			}
			if br == nil {
				br = bufio.NewReaderSize(conn, 32<<10)
			} else {
				br.Reset(conn)
			}
		}
		if _, err := conn.Write(req); err != nil {
			r.Errors++
			conn.Close()
			conn = nil
			continue
		}
		r.Sent++
		status, keep, err := readResponse(br)
		d := time.Since(t0)
		if err != nil {
			if time.Now().Before(end) {
				r.Errors++
			}
			conn.Close()
			conn = nil
			continue
		}
		if t0.Add(d).Before(end) {
			r.Requests++
			r.ByClass[min(status/100, 5)]++
			r.Latency.Record(d)
		}
		if !keep || load.NewConnEach {
			conn.Close()
			conn = nil
		}
	}
}

var errBadResponse = errors.New("malformed HTTP response")

// readResponse reads one response and discards its body. It understands
// exactly what a GET can get back: Content-Length, chunked, or a body ended
// by close.
func readResponse(br *bufio.Reader) (status int, keepAlive bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, errBadResponse
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, errBadResponse
	}
	keepAlive = line[7] == '1'
	length := int64(-1)
	chunked := false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil {
				return 0, false, errBadResponse
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.Contains(bytes.ToLower(value), []byte("close")) {
				keepAlive = false
			}
		}
	}
	switch {
	case status == 204 || status == 304 || status/100 == 1:
		return status, keepAlive, nil
	case chunked:
		return status, keepAlive, discardChunked(br)
	case length >= 0:
		_, err = br.Discard(int(length))
		return status, keepAlive, err
	default:
		_, err = io.Copy(io.Discard, br)
		return status, false, err
	}
}

func discardChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		hex, _, _ := bytes.Cut(bytes.TrimSpace(line), []byte(";"))
		n, err := strconv.ParseInt(string(hex), 16, 64)
		if err != nil || n < 0 {
			return errBadResponse
		}
		if n == 0 {
			// Trailers end with an empty line.
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(line) <= 2 {
					return nil
				}
			}
		}
		if _, err := br.Discard(int(n) + 2); err != nil {
			return err
		}
	}
}
