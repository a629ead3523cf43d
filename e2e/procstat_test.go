package e2e

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

func TestUnitProcStat(t *testing.T) {
	cpu, err := parseStatCPU("1234 (serve (x) y) S 1 1234 1234 0 -1 4194560 5000 0 0 0 250 50 0 0 20 0 12 0 100 1000000 2500 18446744073709551615")
	if err != nil || cpu != 3*time.Second {
		t.Errorf("parseStatCPU = %v, %v; want 3s (250+50 ticks)", cpu, err)
	}
	if _, err := parseStatCPU("no name"); err == nil {
		t.Error("parseStatCPU accepted a line without a command name")
	}
	rss, err := parseStatusRSS("Name:\tserve\nVmRSS:\t   39512 kB\nThreads:\t9\n")
	if err != nil || rss != 39512*1024 {
		t.Errorf("parseStatusRSS = %d, %v", rss, err)
	}
	if _, err := parseStatusRSS("Name:\tserve\n"); err == nil {
		t.Error("parseStatusRSS accepted a status without VmRSS")
	}
	a := ProcSample{At: time.Unix(100, 0), CPU: time.Second}
	b := ProcSample{At: time.Unix(110, 0), CPU: 1500 * time.Millisecond}
	if s := CPUShare(a, b); s < 0.0499 || s > 0.0501 {
		t.Errorf("CPUShare = %v, want 0.05", s)
	}
}

// The connection count sees this process's own connections to a listener,
// and only those to that port.
func TestUnitConnectionsTo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// The accepting side's sockets are this process's too, but their
	// remote port is the dialer's, not the listener's.
	n, err := ConnectionsTo(os.Getpid(), port)
	if err != nil || n != 3 {
		t.Errorf("ConnectionsTo(self, %d) = %d, %v; want 3", port, n, err)
	}
	other, _ := strconv.Atoi("1")
	if n, _ := ConnectionsTo(os.Getpid(), other); n != 0 {
		t.Errorf("ConnectionsTo(self, 1) = %d, want 0", n)
	}
}
