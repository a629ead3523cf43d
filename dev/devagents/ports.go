package devagents

import (
	"fmt"
	"net"
	"strconv"
)

// Ports are every port of one Consul dev agent and one Nomad dev agent.
// Consul's -dev defaults are fixed (8500, 8600, 8300-8302), so a second
// pair on one machine needs them all chosen.
type Ports struct {
	ConsulHTTP, ConsulDNS, ConsulServer, ConsulSerfLAN, ConsulSerfWAN, ConsulGRPC int
	NomadHTTP, NomadRPC, NomadSerf                                                int
}

func (p *Ports) fields() []*int {
	return []*int{&p.ConsulHTTP, &p.ConsulDNS, &p.ConsulServer, &p.ConsulSerfLAN, &p.ConsulSerfWAN, &p.ConsulGRPC, &p.NomadHTTP, &p.NomadRPC, &p.NomadSerf}
}

// consulLeader is what the Consul server configured with p answers on
// /v1/status/leader: its server RPC address (every config binds loopback).
func (p Ports) consulLeader() string { return "127.0.0.1:" + strconv.Itoa(p.ConsulServer) }

// nomadLeader is the same for the Nomad server: its RPC address.
func (p Ports) nomadLeader() string { return "127.0.0.1:" + strconv.Itoa(p.NomadRPC) }

// FillFree returns p with every zero port replaced by one free on 127.0.0.1.
// Every listener is held until all are picked, so no two fields get the
// same port; a port given in p is kept as it is (see PortFree).
func (p Ports) FillFree() (Ports, error) {
	err := fillFreeOn("127.0.0.1", p.fields())
	return p, err
}

// fillFreeOn sets every zero field to a port free on host, holding each
// listener until all are picked so that no two fields get the same port and
// none takes a port another field was given.
func fillFreeOn(host string, fields []*int) error {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	taken := map[int]bool{}
	for _, f := range fields {
		taken[*f] = *f != 0
	}
	for _, f := range fields {
		for *f == 0 {
			ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				return fmt.Errorf("pick a free port on %s: %w", host, err)
			}
			lns = append(lns, ln)
			if port := ln.Addr().(*net.TCPAddr).Port; !taken[port] {
				*f, taken[port] = port, true
			}
		}
	}
	return nil
}

// PortFree returns an error naming the port and what it was meant for if
// something already listens on 127.0.0.1:port.
func PortFree(port int, what string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("port %d (%s) is in use on 127.0.0.1: %v", port, what, err)
	}
	return ln.Close()
}
