package devagents

import (
	"fmt"
	"net/netip"
)

// DefaultFirstNodeAddr is the address of a dev cluster's first node,
// 127.0.0.2; the server keeps 127.0.0.1.
func DefaultFirstNodeAddr() netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, 2}) }

// NodeAddrs returns n consecutive addresses from first, one per node. They
// must all be in 127.0.0.0/8, which Linux routes to lo as a whole, so an
// address added there reaches nothing but this machine; none may be
// 127.0.0.1 (the server's, and every single dev agent's) or the network's
// first or last address.
func NodeAddrs(first netip.Addr, n int) ([]netip.Addr, error) {
	if n < 1 {
		return nil, fmt.Errorf("node addresses: want at least 1 node, got %d", n)
	}
	out := make([]netip.Addr, 0, n)
	a := first
	for i := range n {
		if !nodeAddrOK(a) {
			return nil, fmt.Errorf("node addresses from %s: node %d would get %s; use addresses in 127.0.0.0/8 other than 127.0.0.0, 127.0.0.1 and 127.255.255.255", first, i+1, a)
		}
		out = append(out, a)
		a = a.Next()
	}
	return out, nil
}

func nodeAddrOK(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	b := a.As4()
	if b[0] != 127 {
		return false
	}
	switch a {
	case netip.AddrFrom4([4]byte{127, 0, 0, 0}), netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.AddrFrom4([4]byte{127, 255, 255, 255}):
		return false
	}
	return true
}
