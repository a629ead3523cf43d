package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// RouteRemover is what Delete needs of Consul (consulroute.Client).
type RouteRemover interface {
	Delete(ctx context.Context, namespace, service string) error
	Registrations(ctx context.Context, revision string, index uint64) ([]consulroute.Registration, uint64, error)
}

// Delete removes a service: its route (Consul config entries and KV record)
// first, so nothing routes to it, then every revision job, purged from
// Nomad, and then, for up to wait (0: not at all), it waits until Consul
// lists nothing of the revisions: Nomad takes an instance out when its
// allocation has stopped, and a control-plane replica its stand-in when it
// sees the revision gone. Each step done is said on out. A route it could
// not remove keeps every job (purging them under a live route would leave
// traffic pointing at nothing); a job it could not purge is said on diag,
// the others are purged, and it returns ErrFailed. What is still in Consul
// after wait is said on diag, with why and who removes it; the service is
// deleted all the same.
func Delete(ctx context.Context, nomad RevisionStore, consul RouteRemover, namespace, service string, wait time.Duration, out, diag io.Writer) error {
	revs, err := nomad.Revisions(ctx, namespace, service)
	if err != nil {
		return err
	}
	routeErr := consul.Delete(ctx, namespace, service)
	switch {
	case routeErr == nil:
		fmt.Fprintf(out, "%s: route removed from Consul\n", service)
	case errors.Is(routeErr, consulroute.ErrNotFound):
		if len(revs) == 0 {
			return fmt.Errorf("service %q not found in namespace %s (nothing in Nomad or Consul)", service, namespace)
		}
	default:
		return fmt.Errorf("%w\nNo revision was purged; run delete again", routeErr)
	}
	failed := false
	for _, r := range revs {
		if err := nomad.Purge(ctx, r.Name); err != nil && !errors.Is(err, nomadjob.ErrNotFound) {
			fmt.Fprintf(diag, "nomad-serverless delete: %v\n", err)
			failed = true
			continue
		}
		fmt.Fprintf(out, "%s: purged from Nomad\n", r.Name)
	}
	if failed {
		fmt.Fprintln(diag, "Some revisions were not purged; run delete again.")
		return ErrFailed
	}
	if wait > 0 {
		awaitGone(ctx, consul, revs, wait, out, diag)
	}
	return nil
}

// awaitGone waits, with Consul's blocking queries and for at most wait in
// all, until Consul lists nothing in each revision's service. It says once
// on out what it waits for, and on diag what is left when the time is up.
func awaitGone(ctx context.Context, consul RouteRemover, revs []nomadjob.RevisionStatus, wait time.Duration, out, diag io.Writer) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for _, r := range revs {
		var index uint64
		said := false
		for {
			regs, next, err := consul.Registrations(ctx, r.Name, index)
			if err != nil {
				if ctx.Err() != nil {
					// The time is up: one last look, to say what is left.
					last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					regs, _, err = consul.Registrations(last, r.Name, 0)
					cancel()
				}
				switch {
				case err != nil:
					fmt.Fprintf(diag, "nomad-serverless delete: %v\n", err)
				case len(regs) > 0:
					fmt.Fprintf(diag, "nomad-serverless delete: %s: still in Consul after %s (the service is deleted):\n", r.Name, wait)
					for _, reg := range regs {
						fmt.Fprintf(diag, "  %s\n", describeLeftover(reg))
					}
				}
				break
			}
			if len(regs) == 0 {
				if said {
					fmt.Fprintf(out, "%s: gone from Consul\n", r.Name)
				}
				break
			}
			if !said {
				fmt.Fprintf(out, "%s: waiting for Consul to drop %s\n", r.Name, describeWaiting(regs))
				said = true
			}
			index = next
		}
	}
}

// describeWaiting says in one line what is still registered.
func describeWaiting(regs []consulroute.Registration) string {
	instances, standIns := 0, 0
	for _, r := range regs {
		if r.Replica != "" {
			standIns++
		} else {
			instances++
		}
	}
	var parts []string
	if instances > 0 {
		parts = append(parts, plural(instances, "instance")+" (Nomad removes each when its allocation has stopped)")
	}
	if standIns > 0 {
		parts = append(parts, plural(standIns, "activator stand-in")+" (each control-plane replica removes its own)")
	}
	return strings.Join(parts, " and ")
}

// describeLeftover says what one registration left after the wait is, and
// who removes it.
func describeLeftover(r consulroute.Registration) string {
	switch {
	case r.Replica != "" && r.Status == "critical":
		return fmt.Sprintf("%s on node %s: the stand-in of control-plane replica %s, which is not running: the leading replica removes it through that node's agent a few seconds after the replica's Consul session ended (or the replica itself when Nomad has restarted it, or Consul a minute after its check failed)", r.ID, r.Node, r.Replica)
	case r.Replica != "":
		return fmt.Sprintf("%s on node %s: the stand-in of control-plane replica %s (%s), which has not seen the delete yet: see its log (nomad alloc logs)", r.ID, r.Node, r.Replica, r.Status)
	default:
		return fmt.Sprintf("%s on node %s (%s): its allocation has not stopped yet; Nomad removes it when it has (nomad job status shows the allocation)", r.ID, r.Node, r.Status)
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
