package localcluster

import (
	"fmt"
	"os"
	"testing"
)

// The ports lie outside the kernel's ephemeral range, where no outgoing
// connection takes them meanwhile, and differ.
func TestFreePorts(t *testing.T) {
	lo, hi := dynamicPorts()
	ports, err := freePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("port %d: outside [%d, %d) or twice in %v", p, lo, hi, ports)
		}
		seen[p] = true
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(b), &elo, &ehi); err == nil && lo <= ehi && hi > elo {
			t.Errorf("range [%d, %d) overlaps the ephemeral range %d-%d", lo, hi, elo, ehi)
		}
	}
}
