package localcluster

import (
	"fmt"
	"net"
	"slices"
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

// freePorts asks the OS for n distinct free ports on 127.0.0.1. All n
// listeners are open at once, so the ports differ; another process may still
// take one before our child binds it, which the caller survives by replacing
// an instance whose process exits.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen on 127.0.0.1:0: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
