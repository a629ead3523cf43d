package devagents

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Loopback is a set of addresses added to lo for a dev cluster's nodes. It
// guarantees they are removed again however the process that added them
// ends: a keeper process (sh) holds the list on its standard input, a pipe
// whose only writer is this process, and removes every address it was told
// of once that pipe closes, which the kernel does when this process exits,
// a SIGKILL included. Release closes it on the normal path.
//
// The keeper ignores SIGINT, SIGTERM and SIGHUP: a guard (Guard.StopFirst)
// or a Ctrl-C at the terminal must not end it before it has removed the
// addresses, and it ends by itself as soon as it has.
type Loopback struct {
	keeper *Proc
	w      *os.File
	addrs  []netip.Addr
}

// keeperScript is run as `sh -c keeperScript <ip binary> <log prefix>`: it
// reads one address (a.b.c.d/32) a line until end of file, then removes each
// from lo.
const keeperScript = `trap '' INT TERM HUP
added=
while read -r a; do
  added="$added $a"
  echo "holding $a on lo"
done
status=0
for a in $added; do
  if "$0" addr del "$a" dev lo; then
    echo "removed $a from lo"
  else
    status=1
  fi
done
exit $status
`

// HoldLoopback starts a keeper (its output in logPath), then adds each
// address to lo with ipBin (`ip addr add <a>/32 dev lo`) and hands it to the
// keeper. If an address cannot be added (it is already there, or this
// process may not: that needs root or CAP_NET_ADMIN), the ones added so
// far are removed and the error says which and why. Linux only.
func HoldLoopback(ipBin, logPath string, addrs []netip.Addr, g *Guard) (*Loopback, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("add loopback addresses: a dev cluster needs Linux (its nodes' addresses are added to lo with ip), not %s", runtime.GOOS)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("add loopback addresses: pipe to the keeper: %w", err)
	}
	// The pipe is close-on-exec (os.Pipe), so the keeper's stdin is its
	// only inherited copy, and no agent started later holds the write
	// end open past this process.
	keeper, err := StartProc(Command{Name: "loopback keeper", Path: "/bin/sh", Args: []string{"-c", keeperScript, ipBin}, Env: ChildEnv(os.Environ()), LogPath: logPath, Stdin: r})
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("add loopback addresses: %w", err)
	}
	g.StopFirst(keeper.Pid(), keeper.Name)
	l := &Loopback{keeper: keeper, w: w}
	for _, a := range addrs {
		cidr := a.String() + "/32"
		out, err := exec.Command(ipBin, "addr", "add", cidr, "dev", "lo").CombinedOutput()
		if err != nil {
			rerr := l.Release(10 * time.Second)
			return nil, errors.Join(fmt.Errorf("add %s to lo (%s addr add %s dev lo): %s%s", cidr, ipBin, cidr, describeExit(err, out), addAddrHint(string(out), a)), rerr)
		}
		if _, err := fmt.Fprintln(w, cidr); err != nil {
			// The keeper is gone and cannot remove it: do it now.
			exec.Command(ipBin, "addr", "del", cidr, "dev", "lo").Run()
			rerr := l.Release(10 * time.Second)
			return nil, errors.Join(fmt.Errorf("add %s to lo: hand it to the keeper: %w", cidr, err), rerr)
		}
		l.addrs = append(l.addrs, a)
	}
	return l, nil
}

// Addrs are the addresses held.
func (l *Loopback) Addrs() []netip.Addr { return l.addrs }

// Release has the keeper remove every address and waits up to timeout for
// it to finish. It returns an error if the keeper failed to remove one (its
// log says which) or did not finish in time. Calling it again does nothing.
func (l *Loopback) Release(timeout time.Duration) error {
	if l.w == nil {
		return nil
	}
	l.w.Close()
	l.w = nil
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.keeper.Done():
	case <-t.C:
		l.keeper.Stop(time.Second)
		return fmt.Errorf("remove loopback addresses %v: the keeper did not finish within %s%s", l.addrs, timeout, l.keeper.logTail())
	}
	if l.keeper.err != nil {
		return fmt.Errorf("remove loopback addresses %v: %s", l.addrs, l.keeper.Describe())
	}
	return nil
}

// describeExit is a failed command's output, or its error without one.
func describeExit(err error, out []byte) string {
	if s := strings.TrimSpace(string(out)); s != "" {
		return s
	}
	return err.Error()
}

// addAddrHint says what to do about the usual reasons ip refuses an
// address.
func addAddrHint(out string, a netip.Addr) string {
	switch {
	case strings.Contains(out, "File exists"):
		return fmt.Sprintf(" (%s is already on lo: is another dev cluster running? If not, remove it: ip addr del %s/32 dev lo)", a, a)
	case strings.Contains(out, "Operation not permitted"):
		return " (adding an address to lo needs root or CAP_NET_ADMIN)"
	}
	return ""
}
