package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// deployNomad is what deploy needs of Nomad (nomadjob.Client).
type deployNomad interface {
	Plan(ctx context.Context, svc *spec.Service) (nomadjob.Plan, error)
	Register(ctx context.Context, job *nomadapi.Job, enforceIndex uint64) (string, error)
	UpdateScaling(ctx context.Context, revision string, s spec.Scaling) error
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
	AllServices(ctx context.Context) ([]nomadjob.ServiceRef, error)
	Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error
	Stop(ctx context.Context, revision string) error
	Purge(ctx context.Context, revision string) error
}

// deployConsul is what deploy needs of Consul (consulroute.Client).
type deployConsul interface {
	ReadRecord(ctx context.Context, namespace, service string) (consulroute.Record, uint64, error)
	Records(ctx context.Context) ([]consulroute.Record, error)
	Publish(ctx context.Context, rec consulroute.Record, casIndex uint64) error
	Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error)
	Gateways(ctx context.Context) ([]consulroute.Gateway, error)
}

// deployer carries out `deploy` for the services of one or more files.
type deployer struct {
	nomad   deployNomad
	consul  deployConsul
	compile nomadjob.Options
	out     io.Writer // progress and results
	tty     bool      // out is a terminal: progress rewrites one line
	detach  bool
	wait    time.Duration
	poll    time.Duration
	now     func() time.Time
	retain  consulroute.RetentionPolicy
}

func runDeploy(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "deploy", `Usage: nomad-serverless deploy [options] file.hcl [more.hcl]

Makes a revision of every service in the files (only when its template changed),
waits until it is ready, then routes its traffic. Nothing is submitted if any
service is invalid.

`)
	vars := addVarFlags(fs)
	sidecar := addSidecarFlags(fs, e.getenv)
	detach := fs.Bool("detach", false, "submit and route without waiting for the revision to be ready")
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for a new revision's instances to pass their checks")
	files, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(files) == 0 {
		fmt.Fprintln(e.stderr, "nomad-serverless deploy: name at least one service file, e.g. nomad-serverless deploy hello.hcl")
		return exitUsage
	}
	opts, err := sidecar.options()
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless deploy: %v\n", err)
		return exitUsage
	}

	parsed, ok := parseServiceFiles(e, files, vars.Options(e.getenv))
	if !ok {
		// Say it as a refused plan does: a user must not wonder whether
		// the other services of the files went out.
		fmt.Fprintln(e.stderr, "Nothing was deployed.")
		return exitError
	}
	nomad, err := newNomad()
	if err != nil {
		return errorLine(e, "deploy", err)
	}
	consul, err := newConsul()
	if err != nil {
		return errorLine(e, "deploy", err)
	}
	d := &deployer{
		nomad: nomad, consul: consul, compile: opts,
		out: e.stdout, tty: isTerminal(e.stdout),
		detach: *detach, wait: *wait, poll: 500 * time.Millisecond,
		now: time.Now, retain: consulroute.DefaultRetention(),
	}
	return d.run(ctx, e, parsed)
}

// parsedService is one service with the file it came from, for diagnostics.
type parsedService struct {
	file  *svchcl.File
	index int
}

func (p parsedService) service() *spec.Service { return &p.file.Services[p.index] }

// parseServiceFiles parses every file and prints every diagnostic; ok is false
// when any file has an error or two files declare the same service.
func parseServiceFiles(e *env, files []string, opts svchcl.Options) ([]parsedService, bool) {
	var out []parsedService
	ok := true
	seen := map[string]string{}
	for _, path := range files {
		f, diags := svchcl.ParseFile(path, opts)
		if len(diags) > 0 {
			_ = f.WriteDiagnostics(e.stderr, diags)
		}
		if diags.HasErrors() {
			ok = false
			continue
		}
		for i, s := range f.Services {
			key := s.Namespace + "/" + s.Name
			if prev, dup := seen[key]; dup {
				fmt.Fprintf(e.stderr, "Error: service %q (namespace %s) is declared in both %s and %s; deploy one of them.\n", s.Name, s.Namespace, prev, path)
				ok = false
				continue
			}
			seen[key] = path
			out = append(out, parsedService{file: f, index: i})
		}
	}
	if ok && len(out) == 0 {
		fmt.Fprintln(e.stderr, "Error: the files declare no service; add a service \"name\" { ... } block.")
		ok = false
	}
	return out, ok
}

// servicePlan is what deploy will do to one service, decided before anything
// is written.
type servicePlan struct {
	parsedService
	plan      nomadjob.Plan
	record    consulroute.Record
	recordIdx uint64 // 0: the service has no record yet
}

func (d *deployer) run(ctx context.Context, e *env, services []parsedService) int {
	// Decide and check everything first: a refused deploy changes nothing.
	var plans []servicePlan
	failed := false
	inUse, err := d.serviceNamespaces(ctx)
	if err != nil {
		return errorLine(e, "deploy", err)
	}
	for _, ps := range services {
		sp, diagOK, err := d.planService(ctx, e, ps, inUse)
		if err != nil {
			return errorLine(e, "deploy", err)
		}
		failed = failed || !diagOK
		plans = append(plans, sp)
	}
	if failed {
		fmt.Fprintln(e.stderr, "Nothing was deployed.")
		return exitError
	}
	code := exitOK
	for _, sp := range plans {
		if err := d.apply(ctx, sp); err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless deploy: %s: %s\n", sp.service().Name, strings.TrimSpace(err.Error()))
			code = exitError
		}
	}
	return code
}

// planService plans one service and checks its traffic against the revisions
// that exist; problems are printed as located diagnostics.
func (d *deployer) planService(ctx context.Context, e *env, ps parsedService, inUse map[string][]string) (servicePlan, bool, error) {
	svc := ps.service()
	sp := servicePlan{parsedService: ps}
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
		_ = ps.file.WriteDiagnostics(e.stderr, ps.file.Problems(ps.index, problems))
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
func (d *deployer) serviceNamespaces(ctx context.Context) (map[string][]string, error) {
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
func (d *deployer) apply(ctx context.Context, sp servicePlan) error {
	svc := sp.service()
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
	if d.detach || sp.recordIdx == 0 {
		if err := d.publish(ctx, svc, name); err != nil {
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
		if err := d.publish(ctx, svc, name); err != nil {
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
func (d *deployer) stopFailed(ctx context.Context, revision string, why error) error {
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
func (d *deployer) register(ctx context.Context, svc *spec.Service, plan nomadjob.Plan) (string, int, error) {
	for attempt := 0; ; attempt++ {
		rev := plan.Revision
		if plan.Unchanged {
			return rev.Name(), existingDesired(plan, rev.Name()), nil
		}
		job, err := nomadjob.Compile(rev, d.compile)
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
func (d *deployer) publish(ctx context.Context, svc *spec.Service, latest string) error {
	for attempt := 0; ; attempt++ {
		rec, idx, err := d.consul.ReadRecord(ctx, svc.Namespace, svc.Name)
		if err != nil && !errors.Is(err, consulroute.ErrNotFound) {
			return err
		}
		next := consulroute.Record{
			Service:   *svc,
			Latest:    latest,
			Revisions: mergeRevisions(rec.Revisions, latest, svc.Traffic),
			Deleting:  rec.Deleting,
			UpdatedAt: d.now().UTC(),
		}
		err = d.consul.Publish(ctx, next, idx)
		if err == nil {
			fmt.Fprintf(d.out, "%s: route published (%s)\n", svc.Name, describeTraffic(next))
			return nil
		}
		if !errors.Is(err, consulroute.ErrConflict) || attempt == 4 {
			return err
		}
	}
}

// mergeRevisions is the published set after routing latest: what was
// published, latest, and every revision the traffic names.
func mergeRevisions(have []string, latest string, traffic []spec.TrafficTarget) []string {
	out := slices.Clone(have)
	add := func(r string) {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	add(latest)
	for _, t := range traffic {
		add(t.Revision)
	}
	slices.Sort(out)
	return out
}

// describeTraffic is a record's route on one line (see describeRoute).
func describeTraffic(rec consulroute.Record) string {
	route, err := rec.Route()
	if err != nil {
		return "invalid: " + err.Error()
	}
	return describeRoute(route)
}

// waitReady waits until want instances of the revision pass their Consul
// check, printing progress; it fails early when Nomad reports a failed
// allocation, and at the deadline with what Nomad and Consul last said.
func (d *deployer) waitReady(ctx context.Context, revision string, want int) error {
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
		if aerr == nil {
			if why := failedAllocation(allocs); why != "" {
				return fmt.Errorf("revision %s failed to start: %s%s", revision, why, checkOutputs(health))
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

// allocSummary counts allocations by client status: "2 running, 1 pending".
func allocSummary(allocs []nomadjob.Allocation) string {
	if len(allocs) == 0 {
		return "no allocations yet"
	}
	counts := map[string]int{}
	var order []string
	for _, a := range allocs {
		if a.DesiredStatus != "run" {
			continue
		}
		if counts[a.ClientStatus] == 0 {
			order = append(order, a.ClientStatus)
		}
		counts[a.ClientStatus]++
	}
	slices.Sort(order)
	parts := make([]string, 0, len(order))
	for _, s := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
	}
	if len(parts) == 0 {
		return "no allocations meant to run"
	}
	return "allocations " + strings.Join(parts, ", ")
}

// failedAllocation says why an allocation that was meant to run failed, or "".
func failedAllocation(allocs []nomadjob.Allocation) string {
	for _, a := range allocs {
		if a.ClientStatus == "failed" && a.DesiredStatus == "run" || a.ClientStatus == "failed" && a.Failure != "" {
			why := a.Failure
			if why == "" {
				why = "the allocation failed"
			}
			return fmt.Sprintf("allocation %s: %s", shortID(a.ID), why)
		}
	}
	return ""
}

// checkOutputs lists the output of failing readiness checks, the app's own
// words about why it is not ready.
func checkOutputs(health []consulroute.InstanceHealth) string {
	var b strings.Builder
	for _, h := range health {
		if !h.Passing && strings.TrimSpace(h.Output) != "" {
			fmt.Fprintf(&b, "\n  check on %s: %s", h.ID, firstLine(h.Output))
		}
	}
	return b.String()
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// collect garbage-collects old revisions the retention policy lets go:
// unrouted, untagged, not latest, beyond the most recent few and old. A
// failure here never fails the deploy; it is said and left for next time.
func (d *deployer) collect(ctx context.Context, svc *spec.Service, latest string) {
	gone, err := collectRevisions(ctx, d.nomad, d.consul, svc.Namespace, svc.Name, d.retain, d.now())
	if err != nil {
		fmt.Fprintf(d.out, "%s: could not collect old revisions (will retry on the next deploy): %v\n", svc.Name, err)
	}
	for _, g := range gone {
		fmt.Fprintf(d.out, "%s: deleted old revision %s (%s)\n", svc.Name, g.Revision, g.Reason)
	}
}

// printURL prints where the service answers, from the gateways registered in
// Consul.
func (d *deployer) printURL(ctx context.Context, svc *spec.Service) {
	gws, err := d.consul.Gateways(ctx)
	if err != nil || len(gws) == 0 {
		fmt.Fprintf(d.out, "%s: no gateway is running (start `nomad-serverless serve`); mesh clients reach the service as %q\n", svc.Name, svc.Name)
		return
	}
	gw := gws[0]
	host := svc.Name + "." + svc.Namespace + "." + gw.Domain
	fmt.Fprintf(d.out, "%s: http://%s/  (curl -H 'Host: %s' http://%s/)\n", svc.Name, host, host, gw.HostPort())
	for _, dom := range svc.Domains {
		fmt.Fprintf(d.out, "%s: http://%s/\n", svc.Name, dom)
	}
}

// progress shows one changing status line: rewritten in place on a
// terminal, printed only when it changes otherwise (CI logs stay short).
type progress struct {
	out  io.Writer
	tty  bool
	last string
	live bool
}

func (p *progress) show(line string) {
	if p.tty {
		fmt.Fprintf(p.out, "\r\033[K%s", line)
		p.live = true
		return
	}
	// Leave out the elapsed time so an unchanged state prints once.
	key := line
	if i := strings.LastIndex(line, " · "); i >= 0 {
		key = line[:i]
	}
	if key != p.last {
		fmt.Fprintln(p.out, line)
		p.last = key
	}
}

func (p *progress) done() {
	if p.tty && p.live {
		fmt.Fprint(p.out, "\r\033[K")
		p.live = false
	}
}

// sidecarFlags are deploy's -sidecar-* flags: how the queue-proxy reaches the
// nodes. Environment variables NOMAD_SERVERLESS_SIDECAR_{IMAGE,COMMAND,ARTIFACT}
// give cluster-wide defaults.
type sidecarFlags struct {
	image, command, artifact *string
	getenv                   func(string) string
}

func addSidecarFlags(fs *flag.FlagSet, getenv func(string) string) *sidecarFlags {
	return &sidecarFlags{
		image:    fs.String("sidecar-image", "", "run the queue-proxy from this docker `image` (its entrypoint is nomad-serverless); env NOMAD_SERVERLESS_SIDECAR_IMAGE"),
		command:  fs.String("sidecar-command", "", "run the queue-proxy with raw_exec from this absolute `path` on every node; env NOMAD_SERVERLESS_SIDECAR_COMMAND (default: this binary, for local dev clusters)"),
		artifact: fs.String("sidecar-artifact", "", "have Nomad download the queue-proxy binary from this `URL` (an archive holding nomad-serverless); env NOMAD_SERVERLESS_SIDECAR_ARTIFACT"),
		getenv:   getenv,
	}
}

func (s *sidecarFlags) options() (nomadjob.Options, error) {
	pick := func(flagVal *string, envName string) string {
		if *flagVal != "" {
			return *flagVal
		}
		return s.getenv(envName)
	}
	opts := nomadjob.Options{Sidecar: nomadjob.SidecarOptions{
		Image:       pick(s.image, "NOMAD_SERVERLESS_SIDECAR_IMAGE"),
		Command:     pick(s.command, "NOMAD_SERVERLESS_SIDECAR_COMMAND"),
		ArtifactURL: pick(s.artifact, "NOMAD_SERVERLESS_SIDECAR_ARTIFACT"),
	}}
	set := 0
	for _, v := range []string{opts.Sidecar.Image, opts.Sidecar.Command, opts.Sidecar.ArtifactURL} {
		if v != "" {
			set++
		}
	}
	if set > 1 {
		return opts, errors.New("give only one of -sidecar-image, -sidecar-command and -sidecar-artifact")
	}
	if set == 0 {
		exe, err := os.Executable()
		if err != nil {
			return opts, fmt.Errorf("find this binary for the sidecar (give -sidecar-command, -sidecar-image or -sidecar-artifact): %w", err)
		}
		opts.Sidecar.Command = exe
	}
	return opts, nil
}
