package rollout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Nomad is what a deploy needs of Nomad (nomadjob.Client).
type Nomad interface {
	Plan(ctx context.Context, svc *spec.Service) (nomadjob.Plan, error)
	Register(ctx context.Context, job *nomadapi.Job, enforceIndex uint64) (string, error)
	UpdateScaling(ctx context.Context, revision string, s spec.Scaling) error
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
	AllServices(ctx context.Context) ([]nomadjob.ServiceRef, error)
	Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error
	Stop(ctx context.Context, revision string) error
	Purge(ctx context.Context, revision string) error
	TaskLogs
}

// Consul is what a deploy needs of Consul (consulroute.Client).
type Consul interface {
	ReadRecord(ctx context.Context, namespace, service string) (consulroute.Record, uint64, error)
	Records(ctx context.Context) ([]consulroute.Record, error)
	Publish(ctx context.Context, rec consulroute.Record, casIndex uint64) error
	Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error)
	Gateways(ctx context.Context) ([]consulroute.Gateway, error)
}

// Config is how a Deployer works. New checks it.
type Config struct {
	Nomad  Nomad
	Consul Consul
	// Compile are the options revisions are compiled with (the sidecar).
	Compile nomadjob.Options
	// Out gets progress and results; Diag gets the diagnostics of a
	// refused deploy and why a service failed. nil discards.
	Out, Diag io.Writer
	// TTY: Out is a terminal, so progress rewrites one line.
	TTY bool
	// Detach submits and routes without waiting for revisions to be ready.
	Detach bool
	// Wait bounds the wait for a new revision's instances; Poll is how
	// often Nomad and Consul are asked meanwhile (0: 500 ms).
	Wait, Poll time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Retain is the policy old revisions are collected by after a deploy.
	Retain consulroute.RetentionPolicy
	// DockerEngines, when set, lists the cluster's docker engines. A
	// revision of a published docker app is compiled to start its
	// queue-proxy beside the app when every engine announces addresses
	// (nomadjob.DockerAnnounces); nil, or an error reading them, keeps
	// the proxy after the app. Read once per deploy, and only for such a
	// revision.
	DockerEngines func(ctx context.Context) ([]nomadjob.DockerEngine, error)
}

// Deployer carries out `deploy` for the services of one or more files.
type Deployer struct {
	nomad   Nomad
	consul  Consul
	compile nomadjob.Options
	out     io.Writer // progress and results
	diag    io.Writer // diagnostics and failures
	tty     bool      // out is a terminal: progress rewrites one line
	detach  bool
	wait    time.Duration
	poll    time.Duration
	now     func() time.Time
	retain  consulroute.RetentionPolicy

	engines     func(ctx context.Context) ([]nomadjob.DockerEngine, error)
	enginesOnce sync.Once
	announces   bool // every docker engine announces (read once)
}

// New returns a Deployer working as c says.
func New(c Config) (*Deployer, error) {
	if c.Nomad == nil || c.Consul == nil {
		return nil, errors.New("rollout: Config.Nomad and Config.Consul are required")
	}
	if c.Poll < 0 {
		return nil, fmt.Errorf("rollout: Config.Poll %s is negative", c.Poll)
	}
	d := &Deployer{
		nomad: c.Nomad, consul: c.Consul, compile: c.Compile,
		out: cmp.Or[io.Writer](c.Out, io.Discard), diag: cmp.Or[io.Writer](c.Diag, io.Discard),
		tty: c.TTY, detach: c.Detach, wait: c.Wait, poll: cmp.Or(c.Poll, 500*time.Millisecond),
		now: c.Now, retain: c.Retain, engines: c.DockerEngines,
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d, nil
}

// Service is one service of a parsed file, with the file for located
// diagnostics.
type Service struct {
	File  *svchcl.File
	Index int
}

// Spec is the service as parsed.
func (s Service) Spec() *spec.Service { return &s.File.Services[s.Index] }

// ErrRefused and ErrFailed are returned once why has been said on the
// diagnostics writer: a refused deploy (a plan did not pass its checks;
// nothing was written), and a deploy or delete in which a service or a
// revision failed (the others went on).
var (
	ErrRefused = errors.New("deploy refused: nothing was deployed")
	ErrFailed  = errors.New("failed: see the messages above")
	// ErrInterrupted: the deploy's context ended (a signal) between or
	// during services; what was deployed and what was not has been said.
	ErrInterrupted = errors.New("interrupted: see the messages above")
)

// servicePlan is what deploy will do to one service, decided before anything
// is written.
type servicePlan struct {
	Service
	plan      nomadjob.Plan
	record    consulroute.Record
	recordIdx uint64 // 0: the service has no record yet
}

// Deploy deploys services: it plans every one first and writes nothing
// when any plan is refused, then applies the plans one by one, going on
// past a service that fails. ErrRefused and ErrFailed are said on Diag;
// any other error (Nomad or Consul unreachable while planning) is not.
func (d *Deployer) Deploy(ctx context.Context, services []Service) error {
	// Decide and check everything first: a refused deploy changes nothing.
	var plans []servicePlan
	failed := false
	inUse, err := d.serviceNamespaces(ctx)
	if err != nil {
		return err
	}
	for _, s := range services {
		sp, diagOK, err := d.planService(ctx, s, inUse)
		if err != nil {
			return err
		}
		failed = failed || !diagOK
		plans = append(plans, sp)
	}
	if failed {
		fmt.Fprintln(d.diag, "Nothing was deployed.")
		return ErrRefused
	}
	var deployed []string
	for i, sp := range plans {
		// A context that ended (SIGTERM, Ctrl-C) stops the deploy at
		// once: going on would fail every remaining service one by one
		// with the same cause (issue 45).
		if ctx.Err() != nil {
			d.sayInterrupted(ctx, deployed, "", plans[i:])
			return ErrInterrupted
		}
		err := d.apply(ctx, sp)
		if err != nil && ctx.Err() != nil {
			d.sayInterrupted(ctx, deployed, sp.Spec().Name, plans[i+1:])
			return ErrInterrupted
		}
		if err != nil {
			fmt.Fprintf(d.diag, "nomad-serverless deploy: %s: %s\n", sp.Spec().Name, strings.TrimSpace(err.Error()))
			failed = true
			continue
		}
		deployed = append(deployed, sp.Spec().Name)
	}
	if failed {
		return ErrFailed
	}
	return nil
}

// sayInterrupted tells, on Diag, what an interrupted deploy did: the
// services deployed, the one cut short (may be ""), the ones not started,
// and how to finish.
func (d *Deployer) sayInterrupted(ctx context.Context, deployed []string, cut string, rest []servicePlan) {
	notStarted := make([]string, len(rest))
	for i, sp := range rest {
		notStarted[i] = sp.Spec().Name
	}
	fmt.Fprintf(d.diag, "nomad-serverless deploy: stopped (%v).\n", context.Cause(ctx))
	fmt.Fprintf(d.diag, "  deployed (%d): %s\n", len(deployed), nameList(deployed))
	if cut != "" {
		fmt.Fprintf(d.diag, "  cut short (1): %s (its revision may be registered without its route)\n", cut)
	}
	fmt.Fprintf(d.diag, "  not started (%d): %s\n", len(notStarted), nameList(notStarted))
	fmt.Fprintln(d.diag, "Deploy the same files again to finish: services already deployed are left as they are.")
}

// nameList names up to a few services, then says how many more.
func nameList(names []string) string {
	const shown = 5
	switch {
	case len(names) == 0:
		return "none"
	case len(names) <= shown:
		return strings.Join(names, ", ")
	default:
		return fmt.Sprintf("%s and %d more", strings.Join(names[:shown], ", "), len(names)-shown)
	}
}

// planService plans one service and checks its traffic against the revisions
// that exist; problems are printed as located diagnostics.
func (d *Deployer) planService(ctx context.Context, s Service, inUse map[string][]string) (servicePlan, bool, error) {
	svc := s.Spec()
	sp := servicePlan{Service: s}
	var err error
	if sp.plan, err = d.nomad.Plan(ctx, svc); err != nil {
		return sp, false, fmt.Errorf("plan %s: %w", svc.Name, err)
	}
	sp.record, sp.recordIdx, err = d.consul.ReadRecord(ctx, svc.Namespace, svc.Name)
	if err != nil && !errors.Is(err, consulroute.ErrNotFound) {
		return sp, false, fmt.Errorf("read the route of %s: %w", svc.Name, err)
	}
	known := sp.plan.Known()
	for _, rev := range sp.record.Deleting {
		delete(known, rev)
	}
	problems := spec.ValidateTrafficRevisions(svc, known)
	ns := cmp.Or(svc.Namespace, spec.DefaultNamespace)
	var taken []string
	for _, n := range inUse[svc.Name] {
		if n != ns {
			taken = append(taken, n)
		}
	}
	if len(taken) > 0 {
		problems = append(problems, spec.Problem{
			Path:    "namespace",
			Summary: fmt.Sprintf("service %q already exists in namespace %s.", svc.Name, strings.Join(taken, ", ")),
			Detail: "Consul's service names and config entries have no namespace, so one service name serves one namespace only " +
				"(its route and revisions would overwrite the other's). Rename this service, or delete the other first: " +
				fmt.Sprintf("nomad-serverless delete -namespace %s %s.", taken[0], svc.Name),
		})
	}
	if len(problems) > 0 {
		_ = s.File.WriteDiagnostics(d.diag, s.File.Problems(s.Index, problems))
		return sp, false, nil
	}
	return sp, true, nil
}

// serviceNamespaces lists, by service name, the namespaces that have a
// service: a record in Consul, or revision jobs in Nomad. It is read once
// per deploy, however many services the files hold (once per service made
// a deploy of many services quadratic: every call lists every record and
// every job). Nomad is asked on a best-effort basis: a token that may not
// list every namespace still deploys, and Consul's records (every
// published service has one) are the check that counts.
func (d *Deployer) serviceNamespaces(ctx context.Context) (map[string][]string, error) {
	seen := map[string]map[string]bool{}
	add := func(name, ns string) {
		if seen[name] == nil {
			seen[name] = map[string]bool{}
		}
		seen[name][ns] = true
	}
	recs, err := d.consul.Records(ctx)
	if err != nil {
		return nil, fmt.Errorf("check that no service is used in another namespace: %w", err)
	}
	for _, r := range recs {
		add(r.Service.Name, r.Namespace())
	}
	if refs, err := d.nomad.AllServices(ctx); err == nil {
		for _, r := range refs {
			add(r.Name, r.Namespace)
		}
	}
	out := make(map[string][]string, len(seen))
	for name, nss := range seen {
		out[name] = slices.Sorted(maps.Keys(nss))
	}
	return out, nil
}

// apply carries out one service's plan: register the revision (or update
// scaling in place), wait for it, route traffic, collect old revisions.
func (d *Deployer) apply(ctx context.Context, sp servicePlan) error {
	svc := sp.Spec()
	rev := sp.plan.Revision
	name := rev.Name()
	created := false
	// want is the count Nomad runs the revision at: deploy waits for
	// that many instances.
	var want int
	switch {
	case sp.plan.Unchanged && sp.plan.ScalingChanged:
		if err := d.nomad.UpdateScaling(ctx, name, rev.Scaling); err != nil {
			return err
		}
		want = countWithin(existingDesired(sp.plan, name), rev.Scaling)
		fmt.Fprintf(d.out, "%s: template unchanged; scaling settings updated in place\n", name)
	case sp.plan.Unchanged:
		want = existingDesired(sp.plan, name)
		fmt.Fprintf(d.out, "%s: template unchanged; no new revision\n", name)
	default:
		var err error
		if name, want, err = d.register(ctx, svc, sp.plan); err != nil {
			return err
		}
		created = true
		fmt.Fprintf(d.out, "%s: registered (generation %d)\n", name, rev.Generation)
	}

	// A service's first revision has no route to protect: publish at once
	// so the activator can hold early requests. Later revisions get traffic
	// only once they are ready, unless -detach.
	published := false
	var ro *consulroute.RolloutRoute
	if d.detach || sp.recordIdx == 0 {
		var err error
		if ro, err = d.publish(ctx, svc, name); err != nil {
			return err
		}
		published = true
	}
	if !d.detach {
		if err := d.waitReady(ctx, name, want); err != nil {
			if created {
				err = d.stopFailed(ctx, name, err)
			}
			if !published {
				err = fmt.Errorf("%w\nTraffic still goes where it went before.", err)
			}
			return err
		}
	}
	if !published {
		var err error
		if ro, err = d.publish(ctx, svc, name); err != nil {
			return err
		}
	}
	if ro.InProgress() && ro.New == name && !d.detach {
		if err := d.followRollout(ctx, svc, ro); err != nil {
			return err
		}
	}
	d.collect(ctx, svc, name)
	d.printURL(ctx, svc)
	return nil
}

// stopFailed stops a new revision that did not become ready, so it does
// not restart forever: scaling it to zero alone does not hold, since the
// autoscaler keeps a new revision at its initial scale until it was once
// ready, and Nomad refuses a count below the revision's min. The scale call
// first records why in Nomad's scaling events (what `status` shows); the
// stopped job stays in Nomad with its allocations for inspection, a later
// deploy makes a new revision, and garbage collection removes it. It
// returns why, with what could not be done.
func (d *Deployer) stopFailed(ctx context.Context, revision string, why error) error {
	ctx = context.WithoutCancel(ctx)
	_ = d.nomad.Scale(ctx, revision, 0, "deploy failed: "+firstLine(why.Error()), nil)
	if err := d.nomad.Stop(ctx, revision); err != nil {
		return fmt.Errorf("%w\nThe revision could not be stopped and may keep restarting: %v", why, err)
	}
	return fmt.Errorf("%w\nRevision %s is stopped; its job and allocations stay in Nomad for inspection", why, revision)
}

// register compiles and registers a new revision and returns its name and
// the count Nomad was given. If another deploy registered the same
// generation in between, it plans again: when that deploy had the same
// template the plan is now "unchanged" and there is nothing to register.
func (d *Deployer) register(ctx context.Context, svc *spec.Service, plan nomadjob.Plan) (string, int, error) {
	for attempt := 0; ; attempt++ {
		rev := plan.Revision
		if plan.Unchanged {
			return rev.Name(), existingDesired(plan, rev.Name()), nil
		}
		opts := d.compile
		if nomadjob.PublishesDockerPort(rev.Template) {
			opts.DockerAnnounces = d.dockerAnnounces(ctx)
		}
		job, err := nomadjob.Compile(rev, opts)
		if err != nil {
			return "", 0, fmt.Errorf("compile revision %s: %w", rev.Name(), err)
		}
		_, err = d.nomad.Register(ctx, job, 0)
		if err == nil {
			return rev.Name(), groupCount(job), nil
		}
		if !errors.Is(err, nomadjob.ErrConflict) || attempt == 2 {
			return "", 0, fmt.Errorf("register revision %s: %w", rev.Name(), err)
		}
		if plan, err = d.nomad.Plan(ctx, svc); err != nil {
			return "", 0, fmt.Errorf("plan %s again after a concurrent deploy: %w", svc.Name, err)
		}
	}
}

// dockerAnnounces reports, once per deploy, whether every docker engine of
// the cluster announces a container's address (nomadjob.DockerAnnounces).
// When it cannot tell it says so once and answers no: the queue-proxy then
// starts after the app, which is always correct, only slower to wake.
func (d *Deployer) dockerAnnounces(ctx context.Context) bool {
	d.enginesOnce.Do(func() {
		if d.engines == nil {
			return
		}
		engines, err := d.engines(ctx)
		if err != nil {
			fmt.Fprintf(d.diag, "Note: the queue-proxy of docker apps starts after the app, not with it (slower wakes): %v\n", err)
			return
		}
		d.announces = nomadjob.DockerAnnounces(engines)
	})
	return d.announces
}

// groupCount is the count of a compiled job's group: the service's
// initial count within its bounds (Compile raises it to min).
func groupCount(job *nomadapi.Job) int {
	for _, g := range job.TaskGroups {
		if g != nil && g.Name != nil && *g.Name == spec.GroupName && g.Count != nil {
			return *g.Count
		}
	}
	return 0
}

// existingDesired is an existing revision's count before the deploy.
func existingDesired(plan nomadjob.Plan, revision string) int {
	for _, r := range plan.Existing {
		if r.Name == revision {
			return r.Desired
		}
	}
	return 0
}

// countWithin is where UpdateScaling puts a count when the bounds change:
// moved to the nearest bound when outside them, else kept.
func countWithin(count int, s spec.Scaling) int {
	hi := s.Max
	if hi == 0 {
		hi = nomadjob.UnboundedMax
	}
	return min(max(count, s.Min), hi)
}

// publish routes the service with latest = revision, retrying when a
// concurrent deploy or traffic change wins the record's check-and-set.
// With an active rollout block and another revision holding the latest
// share, the revision is published at 0 % with a pending rollout, which it
// returns (rolloutFor).
func (d *Deployer) publish(ctx context.Context, svc *spec.Service, latest string) (*consulroute.RolloutRoute, error) {
	for attempt := 0; ; attempt++ {
		rec, idx, err := d.consul.ReadRecord(ctx, svc.Namespace, svc.Name)
		if err != nil && !errors.Is(err, consulroute.ErrNotFound) {
			return nil, err
		}
		next := consulroute.Record{
			Service:   *svc,
			Latest:    latest,
			Revisions: MergeRevisions(rec.Revisions, latest, svc.Traffic),
			Deleting:  rec.Deleting,
			Rollout:   d.rolloutFor(svc, rec, latest),
			UpdatedAt: d.now().UTC(),
		}
		if ro := next.Rollout; ro.InProgress() {
			next.Revisions = MergeRevisions(next.Revisions, ro.Previous, nil)
		}
		err = d.consul.Publish(ctx, next, idx)
		if err == nil {
			if ro := next.Rollout; ro.InProgress() && ro.New == latest {
				fmt.Fprintf(d.out, "%s: %s published at 0 %%; its rollout from %s starts (%s)\n", svc.Name, latest, ro.Previous, DescribeTraffic(next))
			} else {
				fmt.Fprintf(d.out, "%s: route published (%s)\n", svc.Name, DescribeTraffic(next))
			}
			return next.Rollout, nil
		}
		if !errors.Is(err, consulroute.ErrConflict) || attempt == 4 {
			return nil, err
		}
	}
}

// waitReady waits until want instances of the revision pass their Consul
// check, printing progress; it fails early when Nomad reports a failed
// allocation, and at the deadline with what Nomad and Consul last said.
func (d *Deployer) waitReady(ctx context.Context, revision string, want int) error {
	if want <= 0 {
		fmt.Fprintf(d.out, "%s: scaled to zero; the first request wakes it\n", revision)
		return nil
	}
	start := d.now()
	deadline := start.Add(d.wait)
	p := &progress{out: d.out, tty: d.tty}
	defer p.done()
	for {
		health, herr := d.consul.Health(ctx, revision)
		allocs, aerr := d.nomad.Allocations(ctx, revision)
		passing := 0
		for _, h := range health {
			if h.Passing {
				passing++
			}
		}
		p.show(fmt.Sprintf("%s: %d/%d ready · %s · %s", revision, passing, want, allocSummary(allocs), d.now().Sub(start).Round(100*time.Millisecond)))
		if herr == nil && passing >= want {
			p.done()
			fmt.Fprintf(d.out, "%s: ready (%d/%d instances passing) in %s\n", revision, passing, want, d.now().Sub(start).Round(100*time.Millisecond))
			return nil
		}
		for _, err := range []error{herr, aerr} {
			if settingIsWrong(err) {
				return fmt.Errorf("wait for %s: %w", revision, err)
			}
		}
		if aerr == nil {
			if why := failedAllocation(allocs); why != "" {
				return fmt.Errorf("revision %s failed to start: %s%s%s", revision, why, failedTaskLog(ctx, d.nomad, revision, allocs), checkOutputs(health))
			}
		}
		if d.now().After(deadline) {
			reason := fmt.Sprintf("revision %s: %d of %d instances ready after %s", revision, passing, want, d.wait)
			if herr != nil {
				reason += "; Consul: " + herr.Error()
			}
			if aerr != nil {
				reason += "; Nomad: " + aerr.Error()
			} else if s := allocSummary(allocs); s != "" {
				reason += "; " + s
			}
			return fmt.Errorf("%s%s\nSee `nomad job status %s` and `nomad alloc logs`; raise -wait if the app starts slowly", reason, checkOutputs(health), revision)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (the revision stays registered)", revision, ctx.Err())
		case <-time.After(d.poll):
		}
	}
}

// settingIsWrong reports whether err will not go away by waiting: a token
// or a TLS setting that Nomad or Consul refuses. waitReady stops at once on
// one rather than hide it behind its deadline.
func settingIsWrong(err error) bool {
	return errors.Is(err, nomadjob.ErrPermission) || errors.Is(err, nomadjob.ErrTLS) ||
		errors.Is(err, consulroute.ErrPermissionDenied) || errors.Is(err, consulroute.ErrTLS)
}

// collect garbage-collects old revisions the retention policy lets go:
// unrouted, untagged, not latest, beyond the most recent few and old. A
// failure here never fails the deploy; it is said and left for next time.
func (d *Deployer) collect(ctx context.Context, svc *spec.Service, latest string) {
	gone, err := Collect(ctx, d.nomad, d.consul, svc.Namespace, svc.Name, d.retain, d.now())
	if err != nil {
		fmt.Fprintf(d.out, "%s: could not collect old revisions (will retry on the next deploy): %v\n", svc.Name, err)
	}
	for _, g := range gone {
		fmt.Fprintf(d.out, "%s: deleted old revision %s (%s)\n", svc.Name, g.Revision, g.Reason)
	}
}

// printURL prints where the service answers, from the gateways registered in
// Consul: on their public port, or on their internal listener for an
// internal service.
func (d *Deployer) printURL(ctx context.Context, svc *spec.Service) {
	gws, err := d.consul.Gateways(ctx)
	if err != nil || len(gws) == 0 {
		fmt.Fprintf(d.out, "%s: no gateway is running (start `nomad-serverless serve`); mesh clients reach the service as %q\n", svc.Name, svc.Name)
		return
	}
	where := WhereServed(svc.Internal(), gws)
	if svc.Internal() {
		fmt.Fprintf(d.out, "%s: %s\n", svc.Name, where)
		if where.Listener == "" {
			return
		}
	}
	host := svc.Name + "." + svc.Namespace + "." + gws[0].Domain
	fmt.Fprintf(d.out, "%s: http://%s/  (curl -H 'Host: %s' http://%s/)\n", svc.Name, host, host, where.Listener)
	for _, dom := range svc.Domains {
		fmt.Fprintf(d.out, "%s: http://%s/\n", svc.Name, dom)
	}
}
