package testbin

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a TCP port that was free on every address a moment ago,
// for a process the test starts next to listen on. It is never one the
// kernel hands to outgoing connections: a port of the ephemeral range, free
// when asked, is soon the local port of some client's connection on a busy
// machine (every test's clients take them by the thousand), and the process
// started on it a moment later fails with "address already in use". Nor is
// it one of Nomad's dynamic ports (20000 to 32000): Nomad does not know of
// a port a test's serve listens on, and gave it to a sidecar's admin port
// in e2e 18 ("bind: address already in use", the allocation failed). It
// picks at random below both, never the same twice in one test process,
// and checks the port by listening on it on every address, as a sidecar
// binds.
func FreePort(tb testing.TB) int {
	tb.Helper()
	lo, hi := DynamicPorts()
	handed.mu.Lock()
	defer handed.mu.Unlock()
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	for range 1000 {
		p := lo + rand.IntN(hi-lo)
		if handed.ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		handed.ports[p] = true
		return p
	}
	tb.Fatalf("testbin: no free port in %d-%d after 1000 tries", lo, hi-1)
	return 0
}

// handed are the ports FreePort returned in this process.
var handed struct {
	mu    sync.Mutex
	ports map[int]bool
}

// DynamicPorts is the range [lo, hi) FreePort picks from: 10000 to 20000,
// below Nomad's dynamic ports, or, where the kernel's ephemeral range
// overlaps it, the widest stretch outside both.
func DynamicPorts() (lo, hi int) {
	elo, ehi := 32768, 60999 // Linux's default ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, err1 := strconv.Atoi(f[0])
			b, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && a <= b {
				elo, ehi = a, b
			}
		}
	}
	const lo0, hi0, nomadLo, nomadHi = 10000, 20000, 20000, 32000
	if elo >= hi0 || ehi < lo0 {
		return lo0, hi0
	}
	if below, above := elo-1024, 65535-max(ehi, nomadHi-1); below >= above {
		return 1024, min(elo, nomadLo)
	}
	return max(ehi, nomadHi-1) + 1, 65536
}
