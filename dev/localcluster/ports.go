package localcluster

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// portSet remembers the ports handed to instances that may not have bound
// them yet: the OS would give a port it sees free again, and two of our
// children would race for it.
type portSet struct {
	mu    sync.Mutex
	inUse map[int]bool
}

// take returns n ports free in the OS and not handed out before; release
// gives them back when the instance's processes have exited.
func (s *portSet) take(n int) ([]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inUse == nil {
		s.inUse = map[int]bool{}
	}
	for range 20 {
		ports, err := freePorts(n)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(ports, func(p int) bool { return s.inUse[p] }) {
			continue
		}
		for _, p := range ports {
			s.inUse[p] = true
		}
		return ports, nil
	}
	return nil, fmt.Errorf("no %d free ports on 127.0.0.1 after 20 tries", n)
}

func (s *portSet) release(ports []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ports {
		delete(s.inUse, p)
	}
}

// freePorts returns n distinct ports free on every address (the sidecar
// binds them all), picked at random below the kernel's ephemeral range, as
// Nomad's dynamic ports are (20000 to 32000). A port of the ephemeral range,
// free when asked, is soon the local port of some outgoing connection on a
// busy machine, and the child started on it a moment later fails with
// "address already in use" (make test lost instances that way). All n
// listeners are open at once, so the ports differ; another process may still
// take one before our child binds it, which the caller survives by replacing
// an instance whose process exits.
func freePorts(n int) ([]int, error) {
	lo, hi := dynamicPorts()
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d free ports in %d-%d after 1000 tries", n, lo, hi-1)
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(lo+rand.IntN(hi-lo)))
		if err != nil {
			continue // in use
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// dynamicPorts is the range [lo, hi) freePorts picks from: 20000 to 32000,
// or, where the kernel's ephemeral range overlaps it, the widest stretch
// outside that range.
func dynamicPorts() (lo, hi int) {
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
	if elo >= 32000 || ehi < 20000 {
		return 20000, 32000
	}
	if below, above := elo-1024, 65535-ehi; below >= above {
		return 1024, elo
	}
	return ehi + 1, 65536
}
