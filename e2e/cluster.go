package e2e

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The cluster scenarios (scenario 20) sample the cluster every 100 ms while
// they kill a node, and read the figures afterwards from what they saw: a
// timeline, not a wait per event, so that every figure comes from the same
// clock and nothing is missed while another wait runs.

// NotSeen is a NodeLoss time for something that did not happen in the
// timeline.
const NotSeen = time.Duration(-1)

// ClusterSample is one look at a revision on the cluster.
type ClusterSample struct {
	At time.Time
	// NodeStatus is the lost node's status in Nomad ("ready", "down").
	NodeStatus string
	// Allocs are the revision's allocations as Nomad lists them.
	Allocs []SampledAlloc
	// Passing are the addresses (host:port) of the instances Consul
	// reports passing.
	Passing []string
	// Gateways are, per gateway, the instance addresses it routes the
	// revision to; nil when its view could not be read.
	Gateways [][]string
	// Actual is the ready instances the leading autoscaler counts; -1
	// when its view could not be read.
	Actual int
}

// SampledAlloc is one allocation in a sample.
type SampledAlloc struct {
	ID, Node, ClientStatus, DesiredStatus string
}

// running is an allocation Nomad wants running and that runs.
func (a SampledAlloc) running() bool { return a.DesiredStatus == "run" && a.ClientStatus == "running" }

// placed is an allocation Nomad wants running and has not given up on
// (pending or running): what the gateways' catalog may count once Consul
// passes it, a client reporting "running" a moment after its check passes.
func (a SampledAlloc) placed() bool {
	return a.DesiredStatus == "run" && (a.ClientStatus == "running" || a.ClientStatus == "pending")
}

// NodeLoss is what a timeline says about the loss of one node. Every time
// is from the kill; NotSeen when it did not happen.
type NodeLoss struct {
	// NodeDown is when Nomad marked the node down, Lost when it marked
	// every allocation the node ran lost.
	NodeDown, Lost time.Duration
	// ConsulGone is when Consul stopped listing any instance on the
	// node as passing.
	ConsulGone time.Duration
	// Dropped is, per gateway, when it stopped routing to any instance
	// on the node.
	Dropped []time.Duration
	// Replaced is when Nomad listed the wanted number of running
	// allocations again, none on the node; Routed when every gateway
	// routed to that many instances, none on the node.
	Replaced, Routed time.Duration
	// OrphansAtLost is how many instances on the node Consul still listed
	// passing in the sample where Nomad had marked them lost.
	OrphansAtLost int
	// Overcounted lists the samples, from a second after Lost, where the
	// autoscaler counted more ready instances than Nomad had placed
	// (pending or running, not lost); Counted is how many samples from
	// then on read the autoscaler's count at all.
	Overcounted []string
	Counted     int
}

// RoutedToNode is how long after the kill some gateway still routed to the
// node: the latest of Dropped (NotSeen if one never stopped).
func (l NodeLoss) RoutedToNode() time.Duration {
	latest := time.Duration(0)
	for _, d := range l.Dropped {
		if d == NotSeen {
			return NotSeen
		}
		latest = max(latest, d)
	}
	return latest
}

// AnalyzeNodeLoss reads a timeline of the loss of the node with ID node and
// address host, killed at kill, for a revision that wants want instances.
func AnalyzeNodeLoss(samples []ClusterSample, kill time.Time, node, host string, want int) NodeLoss {
	l := NodeLoss{NodeDown: NotSeen, Lost: NotSeen, ConsulGone: NotSeen, Replaced: NotSeen, Routed: NotSeen}
	for _, s := range samples {
		if s.At.Before(kill) {
			continue
		}
		l.Dropped = make([]time.Duration, len(s.Gateways))
		break
	}
	for i := range l.Dropped {
		l.Dropped[i] = NotSeen
	}
	var lostAt time.Time
	for _, s := range samples {
		if s.At.Before(kill) {
			continue
		}
		since := s.At.Sub(kill)
		first := func(d *time.Duration, cond bool) {
			if *d == NotSeen && cond {
				*d = since
			}
		}
		first(&l.NodeDown, s.NodeStatus == "down")
		onNode, lost, elsewhere := 0, 0, 0
		for _, a := range s.Allocs {
			switch {
			case a.Node == node && a.ClientStatus == "lost":
				lost++
			case a.Node == node && (a.ClientStatus == "running" || a.ClientStatus == "pending"):
				onNode++
			case a.Node != node && a.running():
				elsewhere++
			}
		}
		if l.Lost == NotSeen && lost > 0 && onNode == 0 {
			l.Lost, lostAt = since, s.At
			l.OrphansAtLost = countOnHost(s.Passing, host)
		}
		first(&l.ConsulGone, countOnHost(s.Passing, host) == 0)
		first(&l.Replaced, elsewhere >= want)
		routed := len(s.Gateways) > 0
		for i, g := range s.Gateways {
			if g == nil {
				routed = false
				continue
			}
			if i < len(l.Dropped) {
				first(&l.Dropped[i], countOnHost(g, host) == 0)
			}
			routed = routed && countOnHost(g, host) == 0 && len(g) >= want
		}
		first(&l.Routed, routed)
		if lostAt.IsZero() || s.At.Sub(lostAt) < time.Second || s.Actual < 0 {
			continue
		}
		l.Counted++
		if n := placedAllocs(s.Allocs); s.Actual > n {
			l.Overcounted = append(l.Overcounted, fmt.Sprintf("+%s: actual %d, %d allocations placed", FormatDuration(since), s.Actual, n))
		}
	}
	return l
}

func placedAllocs(allocs []SampledAlloc) int {
	n := 0
	for _, a := range allocs {
		if a.placed() {
			n++
		}
	}
	return n
}

// countOnHost counts the addresses (host:port) on host.
func countOnHost(addrs []string, host string) int {
	n := 0
	for _, a := range addrs {
		if h, _, err := net.SplitHostPort(a); err == nil && h == host {
			n++
		}
	}
	return n
}

// ByHost counts addresses (host:port) per host.
func ByHost(addrs []string) map[string]int {
	out := map[string]int{}
	for _, a := range addrs {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			h = a
		}
		out[h]++
	}
	return out
}

// FormatByHost is "127.0.0.2:2 127.0.0.3:1", hosts in order.
func FormatByHost(m map[string]int) string {
	hosts := make([]string, 0, len(m))
	for h := range m {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = fmt.Sprintf("%s:%d", h, m[h])
	}
	return strings.Join(parts, " ")
}

// MetricSum adds up the samples of a counter in Prometheus text whose
// labels contain match (`revision="x"`).
func MetricSum(text, name, match string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') || !strings.Contains(rest, match) {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// InFlightDuring reports whether a request was under way at some moment
// of [from, to]: sent before to and not finished before from.
func (o Outcome) InFlightDuring(from, to time.Time) bool {
	return !o.Start.After(to) && !o.End.Before(from)
}

// FailedNotInFlight returns the failed requests that were not in flight
// during [from, to]: the ones a fault then does not excuse.
func (r Result) FailedNotInFlight(from, to time.Time) Result {
	var out Result
	for _, o := range r.Failed() {
		if !o.InFlightDuring(from, to) {
			out = append(out, o)
		}
	}
	return out
}
