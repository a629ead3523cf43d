package nomadjob

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// RevisionStatus is a revision with what Nomad says of its job now.
type RevisionStatus struct {
	RevisionInfo
	// Status is the job's status in Nomad: pending, running or dead.
	Status string `json:"status"`
	// Submitted is when the job's current version was submitted (a scale
	// call makes a new version).
	Submitted time.Time `json:"submitted,omitzero"`
	// Instance counts of group "app" from Nomad's job summary. Desired is
	// the group count. Nomad's own "healthy" count is not here: it counts
	// deployment health, and revision jobs have deployments switched off;
	// readiness is Consul's (consulroute).
	Desired  int `json:"desired"`
	Running  int `json:"running"`
	Starting int `json:"starting"`
	Queued   int `json:"queued"`
	Failed   int `json:"failed"`
	Lost     int `json:"lost"`
}

// ServiceRef names a service that has revision jobs, with their names in
// generation order.
type ServiceRef struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Revisions []string `json:"revisions"`
}

// readConcurrency bounds the job reads a listing makes at once.
const readConcurrency = 4

// serviceFilter selects one service's revision jobs; ourFilter all of ours.
func serviceFilter(service string) string {
	return fmt.Sprintf("Meta[%q] == %q", spec.JobMetaService, service)
}

var ourFilter = fmt.Sprintf("%q in Meta", spec.JobMetaService)

// list lists job stubs with a filter expression, of jobs whose ID starts
// with prefix ("" for all).
func (c *Client) list(ctx context.Context, op, ns, prefix, filter string) ([]*api.JobListStub, uint64, error) {
	q := c.query(ctx, ns)
	q.Prefix, q.Filter = prefix, filter
	stubs, qm, err := c.api.Jobs().List(q)
	if err != nil {
		return nil, 0, c.wrap(op, ns, capList, err)
	}
	var index uint64
	if qm != nil {
		index = qm.LastIndex
	}
	out := stubs[:0]
	for _, s := range stubs {
		if _, _, ok := spec.ParseRevisionName(s.ID); ok && s.Type == api.JobTypeService {
			out = append(out, s)
			c.remember(s.ID, s.Namespace)
		}
	}
	return out, index, nil
}

// statuses reads the job of every stub (a few at a time) and combines it
// with the stub's summary. Jobs purged in between are left out.
func (c *Client) statuses(ctx context.Context, op string, stubs []*api.JobListStub) ([]RevisionStatus, error) {
	out := make([]*RevisionStatus, len(stubs))
	errs := make([]error, len(stubs))
	sem := make(chan struct{}, readConcurrency)
	var wg sync.WaitGroup
	for i, s := range stubs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ns := s.Namespace
			if ns == "" {
				ns = c.namespaceOf(s.ID)
			}
			job, _, err := c.api.Jobs().Info(s.ID, c.query(ctx, ns))
			if err != nil {
				werr := c.wrap(op+": read revision "+s.ID, ns, capRead, err)
				if !errors.Is(werr, ErrNotFound) {
					errs[i] = werr
				}
				return
			}
			st, err := statusOf(job, s)
			if errors.Is(err, ErrNotOurs) {
				return
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", op, err)
				return
			}
			out[i] = &st
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res := make([]RevisionStatus, 0, len(out))
	for _, st := range out {
		if st != nil {
			res = append(res, *st)
		}
	}
	sort.Slice(res, func(i, j int) bool {
		if res[i].Namespace != res[j].Namespace {
			return res[i].Namespace < res[j].Namespace
		}
		if res[i].Service != res[j].Service {
			return res[i].Service < res[j].Service
		}
		return res[i].Generation < res[j].Generation
	})
	return res, nil
}

func statusOf(job *api.Job, stub *api.JobListStub) (RevisionStatus, error) {
	info, err := RevisionFromJob(job)
	if err != nil {
		return RevisionStatus{}, err
	}
	st := RevisionStatus{RevisionInfo: info, Status: deref(job.Status, stub.Status), Desired: info.Count}
	if t := deref(job.SubmitTime, stub.SubmitTime); t > 0 {
		st.Submitted = time.Unix(0, t).UTC()
		if st.Created.IsZero() && deref(job.Version, 1) == 0 {
			st.Created = st.Submitted
		}
	}
	if stub.JobSummary != nil {
		if g, ok := stub.JobSummary.Summary[spec.GroupName]; ok {
			st.Running, st.Starting, st.Queued, st.Failed, st.Lost = g.Running, g.Starting, g.Queued, g.Failed, g.Lost
		}
	}
	return st, nil
}

// Revisions lists a service's revisions in a namespace, oldest first,
// stopped ones included.
func (c *Client) Revisions(ctx context.Context, namespace, service string) ([]RevisionStatus, error) {
	if namespace == "" {
		namespace = c.namespace
	}
	op := fmt.Sprintf("list revisions of service %s in namespace %s", service, namespace)
	// The prefix narrows Nomad's work to the service's own jobs (its ID
	// index) before the filter reads their meta: a filter alone is
	// evaluated over every job, which made a deploy of many services
	// quadratic.
	stubs, _, err := c.list(ctx, op, namespace, service+"-", serviceFilter(service))
	if err != nil {
		return nil, err
	}
	return c.statuses(ctx, op, stubs)
}

// AllRevisions lists every revision job of ours in every namespace the
// token can read, with the Nomad index of the listing: pass it to
// StreamEvents to follow changes from there.
func (c *Client) AllRevisions(ctx context.Context) ([]RevisionStatus, uint64, error) {
	const op = "list all revisions"
	stubs, index, err := c.list(ctx, op, api.AllNamespacesNamespace, "", ourFilter)
	if err != nil {
		return nil, 0, err
	}
	st, err := c.statuses(ctx, op, stubs)
	return st, index, err
}

// RevisionCount is a revision's instance counts, as `list` shows them.
type RevisionCount struct {
	Name      string `json:"name"`
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	Stopped   bool   `json:"stopped"`
	// Desired is the group count; Running the running instances.
	Desired int `json:"desired"`
	Running int `json:"running"`
}

// AllRevisionCounts lists every revision of ours in every namespace with
// its counts, from one listing plus a read of each job that is not at rest.
// A revision at rest (not stopped, and its summary shows no instance
// running, starting, queued, failed, lost or unknown) has count 0; only
// the job itself says the count of the others. Reading every job, as
// AllRevisions does, made `list` take 4.8 s at 2,716 services, when most
// of them sit at zero (issue 45). The one count this misses is a scale
// call from zero that Nomad's scheduler has not acted on yet.
func (c *Client) AllRevisionCounts(ctx context.Context) ([]RevisionCount, error) {
	const op = "list all revisions"
	stubs, _, err := c.list(ctx, op, api.AllNamespacesNamespace, "", ourFilter)
	if err != nil {
		return nil, err
	}
	out := make([]RevisionCount, 0, len(stubs))
	var active []*api.JobListStub
	for _, s := range stubs {
		svc, _, _ := spec.ParseRevisionName(s.ID)
		ns := s.Namespace
		if ns == "" {
			ns = c.namespaceOf(s.ID)
		}
		rc := RevisionCount{Name: s.ID, Service: svc, Namespace: ns, Stopped: s.Stop}
		var g api.TaskGroupSummary
		if s.JobSummary != nil {
			g = s.JobSummary.Summary[spec.GroupName]
		}
		rc.Running = g.Running
		if !s.Stop && g.Running+g.Starting+g.Queued+g.Failed+g.Lost+g.Unknown > 0 {
			active = append(active, s)
			continue
		}
		out = append(out, rc)
	}
	st, err := c.statuses(ctx, op, active)
	if err != nil {
		return nil, err
	}
	for _, r := range st {
		out = append(out, RevisionCount{Name: r.Name, Service: r.Service, Namespace: r.Namespace, Stopped: r.Stopped, Desired: r.Desired, Running: r.Running})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out, nil
}

// AllServices lists every service that has revision jobs, in every
// namespace, from one listing.
func (c *Client) AllServices(ctx context.Context) ([]ServiceRef, error) {
	stubs, _, err := c.list(ctx, "list all services", api.AllNamespacesNamespace, "", ourFilter)
	if err != nil {
		return nil, err
	}
	type key struct{ ns, name string }
	gens := map[key][]int{}
	for _, s := range stubs {
		svc, gen, _ := spec.ParseRevisionName(s.ID)
		ns := s.Namespace
		if ns == "" {
			ns = c.namespace
		}
		k := key{ns, svc}
		gens[k] = append(gens[k], gen)
	}
	out := make([]ServiceRef, 0, len(gens))
	for k, gs := range gens {
		sort.Ints(gs)
		ref := ServiceRef{Namespace: k.ns, Name: k.name}
		for _, g := range gs {
			ref.Revisions = append(ref.Revisions, spec.RevisionName(k.name, g))
		}
		out = append(out, ref)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Plan is what deploying a service would do to its revisions.
type Plan struct {
	// Unchanged is true when a revision that is not stopped already has
	// the service's template (same spec hash): deploying the same file
	// twice makes no new revision. Revision is then that revision;
	// otherwise it is the next generation, to compile and register.
	Unchanged bool
	// Revision carries the service's current scaling either way.
	Revision spec.Revision
	// ScalingChanged is true when Unchanged and the existing revision's
	// scaling differs from the service's: apply it with UpdateScaling.
	ScalingChanged bool
	// Existing lists the service's revisions before the deploy, oldest
	// first.
	Existing []RevisionStatus
}

// Known is the set of the service's existing revision names, for
// spec.ValidateTrafficRevisions (the planned new revision included).
func (p Plan) Known() map[string]bool {
	known := map[string]bool{p.Revision.Name(): true}
	for _, r := range p.Existing {
		known[r.Name] = true
	}
	return known
}

// Plan decides the revision a deploy of svc makes: none if a revision that
// is not stopped has the same template, else the highest existing
// generation + 1 (generations of purged revisions are gone and may be
// reused; that is fine, their jobs are too).
func (c *Client) Plan(ctx context.Context, svc *spec.Service) (Plan, error) {
	if svc == nil {
		return Plan{}, errors.New("plan: no service")
	}
	existing, err := c.Revisions(ctx, svc.Namespace, svc.Name)
	if err != nil {
		return Plan{}, fmt.Errorf("plan service %s: %w", svc.Name, err)
	}
	p := Plan{Existing: existing}
	hash := svc.Template.Hash()
	highest := 0
	var same *RevisionStatus
	for i := range existing {
		r := &existing[i]
		highest = max(highest, r.Generation)
		if !r.Stopped && r.SpecHash == hash && (same == nil || r.Generation > same.Generation) {
			same = r
		}
	}
	if same != nil {
		p.Unchanged = true
		p.Revision = spec.NewRevision(svc, same.Generation)
		p.ScalingChanged = same.ScalingDefaulted || same.Scaling != svc.Scaling
		return p, nil
	}
	if highest+1 > spec.MaxGeneration {
		return Plan{}, fmt.Errorf("plan service %s: it already has generation %d, the last one possible; purge the service's old revisions (nomad-serverless delete) to start again", svc.Name, highest)
	}
	p.Revision = spec.NewRevision(svc, highest+1)
	return p, nil
}
