package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// RouteRemover is what Delete needs of Consul (consulroute.Client).
type RouteRemover interface {
	Delete(ctx context.Context, namespace, service string) error
	Registrations(ctx context.Context, revision string, index uint64) ([]consulroute.Registration, uint64, error)
	// ReplicaRegistrations says which control-plane replicas run, for
	// what is left after the wait.
	ReplicaRegistrations(ctx context.Context) ([]consulroute.ReplicaRegistration, error)
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
					last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					replicas, rerr := consul.ReplicaRegistrations(last)
					cancel()
					if rerr != nil {
						fmt.Fprintf(diag, "nomad-serverless delete: %v\n", rerr)
					}
					for _, reg := range regs {
						fmt.Fprintf(diag, "  %s\n", describeLeftover(reg, replicas, rerr == nil))
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
// who removes it. replicas are the control-plane replicas' activator
// registrations (known: they could be read).
func describeLeftover(r consulroute.Registration, replicas []consulroute.ReplicaRegistration, known bool) string {
	if r.Replica == "" {
		return fmt.Sprintf("%s on node %s (%s): its allocation has not stopped yet; Nomad removes it when it has (nomad job status shows the allocation)", r.ID, r.Node, r.Status)
	}
	what := fmt.Sprintf("%s on catalog node %s: the stand-in of control-plane replica %s", r.ID, r.Node, r.Replica)
	i := slices.IndexFunc(replicas, func(x consulroute.ReplicaRegistration) bool { return x.Replica == r.Replica })
	switch {
	case !known:
		return what + ", which has not removed it: if the replica runs, see its log (nomad alloc logs); if it died, the leading replica removes its stand-ins a few seconds after its Consul session ended"
	case i < 0:
		return what + ", which is gone: the next control-plane replica to start removes it (it removes the stand-ins of replicas no longer registered), or remove its node by hand: curl -X PUT $CONSUL_HTTP_ADDR/v1/catalog/deregister -d '{\"Node\":\"" + r.Node + "\"}'"
	case replicas[i].Critical:
		return what + ", which is not running: the leading replica removes its stand-ins a few seconds after the replica's Consul session ended (or the replica itself when Nomad has restarted it)"
	default:
		return what + ", which runs and has not seen the delete yet: see its log (nomad alloc logs)"
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
