package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// runRelayMemBench measures the memory of the sidecar's HTTP/2 relay
// (issue 44: bounded at 1,000 idle connections and 10,000 open streams):
// the sidecar of an h2c gRPC app, its RSS at rest, with 1,000 h2c
// connections past their preface and idle, and with 10,000 streams open
// (40 connections of 250, each a gRPC call's head without its message, so
// the app holds it open), then after they close. -bin and -base-bin are
// measured in turn.
func runRelayMemBench(ctx context.Context, o Options) error {
	bins := []string{o.Bin}
	if o.BaseBin != "" {
		bins = append(bins, o.BaseBin)
	}
	for _, bin := range bins {
		if err := relayMem(ctx, o, bin); err != nil {
			return err
		}
	}
	return nil
}

func relayMem(ctx context.Context, o Options, bin string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	appPort, scPort, scAdmin := ports[0], ports[1], ports[2]
	self, err := os.Executable()
	if err != nil {
		return err
	}
	app, err := startProc("grpc-app", self, nil, map[string]string{envGRPCAppChild: strconv.Itoa(appPort)})
	if err != nil {
		return err
	}
	defer app.stop(5 * time.Second)
	if err := app.waitPort(appPort, 10*time.Second); err != nil {
		return err
	}
	sc, err := startSidecar(bin, "sidecar", scPort, appPort, scAdmin, 0, map[string]string{"SERVERLESS_APP_PROTOCOL": "h2c"})
	if err != nil {
		return err
	}
	defer sc.stop(5 * time.Second)
	fmt.Fprintf(o.Out, "\n%s\n", bin)
	report := func(what string) {
		time.Sleep(2 * time.Second)
		rss, err := currentRSS(sc.pid())
		if err != nil {
			fmt.Fprintf(o.Out, "  %-40s %v\n", what, err)
			return
		}
		fmt.Fprintf(o.Out, "  %-40s RSS %s\n", what, fmtMiB(rss))
	}
	report("at rest")

	addr := addrOf(scPort)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 1000 {
		c, err := h2cPreface(addr)
		if err != nil {
			return fmt.Errorf("idle connection %d: %w", len(conns), err)
		}
		conns = append(conns, c)
	}
	report("1,000 idle h2c connections")
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	report("after they closed")

	for i := range 40 {
		c, err := h2cPreface(addr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		var buf, hb bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		enc := hpack.NewEncoder(&hb)
		for j := range 250 {
			hb.Reset()
			for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "bench"},
				{":path", grpcMethod}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"x-stream", strconv.Itoa(i*250 + j)}} {
				_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*j + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
		}
		if _, err := c.Write(buf.Bytes()); err != nil {
			return err
		}
	}
	report("10,000 open streams (40 x 250)")
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	report("after they closed")
	if rss, err := peakRSS(sc.pid()); err == nil {
		fmt.Fprintf(o.Out, "  %-40s %s\n", "peak RSS (VmHWM)", fmtMiB(rss))
	}
	return ctx.Err()
}

// h2cPreface connects to addr and writes HTTP/2's client preface and an
// empty SETTINGS frame; what the server sends is read and dropped.
func h2cPreface(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.WriteString(http2.ClientPreface)
	_ = http2.NewFramer(&buf, nil).WriteSettings()
	if _, err := c.Write(buf.Bytes()); err != nil {
		c.Close()
		return nil, err
	}
	go func() {
		b := make([]byte, 4096)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
		}
	}()
	return c, nil
}

// currentRSS is a process's resident set now (VmRSS).
func currentRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
