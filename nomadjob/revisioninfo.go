package nomadjob

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// ErrNotOurs is returned for a Nomad job that is not a nomad-serverless
// revision (it lacks the serverless.service meta).
var ErrNotOurs = errors.New("not a nomad-serverless revision")

// RevisionInfo is what a revision's Nomad job says about it.
type RevisionInfo struct {
	Name       string `json:"name"`
	Service    string `json:"service"`
	Namespace  string `json:"namespace"`
	Generation int    `json:"generation"`
	SpecHash   string `json:"spec_hash"`
	// Concurrency is the per-instance hard limit (0 = none); Timeout
	// bounds one request.
	Concurrency int           `json:"concurrency"`
	Timeout     time.Duration `json:"timeout"`
	// Scaling is read from the group's scaling policy. ScalingDefaulted is
	// true for a job without our policy (one registered by hand or by an
	// older version): Scaling is then spec.DefaultScaling() within the
	// block's bounds, and an autoscaler should not act on it alone.
	Scaling          spec.Scaling `json:"scaling"`
	ScalingDefaulted bool         `json:"scaling_defaulted,omitempty"`
	// Count is the group's count (the desired number of instances).
	Count int `json:"count"`
	// FloorMin is the lowest count Nomad accepts: the scaling block's Min.
	// It is 0 for revisions compiled since min became the autoscaler's
	// alone, the revision's min for older ones.
	FloorMin int `json:"floor_min,omitempty"`
	// ServiceTags are the tags of the revision's Consul service (ours and
	// the template's), which every instance carries.
	ServiceTags []string `json:"service_tags,omitempty"`
	// Stopped is true once the job was stopped (nomad job stop, or
	// deregistered without purge).
	Stopped bool `json:"stopped"`
	// Created is when Client.Register first registered the revision
	// (zero if unknown); JobModifyIndex is the index to enforce when
	// re-registering the job.
	Created        time.Time `json:"created,omitzero"`
	JobModifyIndex uint64    `json:"job_modify_index,omitempty"`
}

// RevisionFromJob reads a revision job. It fails with ErrNotOurs for a job
// that is not a revision, and says what is malformed in one that claims to
// be.
func RevisionFromJob(job *api.Job) (RevisionInfo, error) {
	if job == nil {
		return RevisionInfo{}, errors.New("read revision: no job")
	}
	id := jobID(job)
	svc, ok := job.Meta[spec.JobMetaService]
	if !ok || svc == "" {
		return RevisionInfo{}, fmt.Errorf("job %s is %w: it has no meta %q", id, ErrNotOurs, spec.JobMetaService)
	}
	var errs []error
	info := infoFromMeta(id, deref(job.Namespace, spec.DefaultNamespace), job.Meta, &errs)
	info.Stopped = deref(job.Stop, false)
	info.JobModifyIndex = deref(job.JobModifyIndex, 0)

	g := appGroup(job)
	if g == nil {
		errs = append(errs, fmt.Errorf("no group %q", spec.GroupName))
	} else {
		info.Count = deref(g.Count, 0)
		if g.Scaling != nil {
			info.FloorMin = int(max(deref(g.Scaling.Min, 0), 0))
		}
		for _, svc := range g.Services {
			if svc != nil && svc.Name == id {
				info.ServiceTags = append([]string(nil), svc.Tags...)
			}
		}
		s, err := ScalingFromJob(job)
		switch {
		case errors.Is(err, ErrNoScalingPolicy):
			info.Scaling, info.ScalingDefaulted = defaultedScaling(g.Scaling), true
		case err != nil:
			errs = append(errs, err)
		default:
			info.Scaling = s
		}
	}
	if len(errs) > 0 {
		return info, fmt.Errorf("read revision %s: %w", id, errors.Join(errs...))
	}
	return info, nil
}

// infoFromMeta reads what a revision job's meta says of it (name, service,
// generation, spec hash, concurrency, timeout, created): all that a job
// listing with meta carries (RevisionFromStub) and the job itself
// (RevisionFromJob). The job's meta has serverless.service; what is
// malformed is added to errs.
func infoFromMeta(id, namespace string, meta map[string]string, errs *[]error) RevisionInfo {
	svc := meta[spec.JobMetaService]
	info := RevisionInfo{Name: id, Service: svc, Namespace: namespace, SpecHash: meta[spec.JobMetaSpecHash]}
	bad := func(format string, a ...any) { *errs = append(*errs, fmt.Errorf(format, a...)) }

	if rn := meta[spec.JobMetaRevision]; rn != "" && rn != id {
		bad("meta %s is %q but the job is %q", spec.JobMetaRevision, rn, id)
	}
	psvc, pgen, ok := spec.ParseRevisionName(id)
	if !ok || psvc != svc {
		bad("job ID %q is not a revision name of service %q", id, svc)
	}
	info.Generation = pgen
	if g := meta[spec.JobMetaGen]; g != "" {
		n, err := strconv.Atoi(g)
		if err != nil || (ok && n != pgen) {
			bad("meta %s is %q, the job ID says %d", spec.JobMetaGen, g, pgen)
		}
	}
	if c := meta[spec.JobMetaConcurren]; c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 {
			bad("meta %s is %q, want a whole number", spec.JobMetaConcurren, c)
		}
		info.Concurrency = n
	}
	info.Timeout = spec.DefaultTimeout
	if v := meta[JobMetaTimeout]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			bad("meta %s is %q, want a positive duration", JobMetaTimeout, v)
		}
		info.Timeout = d
	}
	if v := meta[JobMetaCreated]; v != "" {
		if ts, err := time.Parse(time.RFC3339, v); err == nil {
			info.Created = ts
		}
	}
	return info
}

func defaultedScaling(b *api.ScalingPolicy) spec.Scaling {
	s := spec.DefaultScaling()
	if b == nil {
		return s
	}
	if b.Min != nil {
		s.Min = int(*b.Min)
	}
	if b.Max != nil {
		s.Max = int(*b.Max)
	}
	return s
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
