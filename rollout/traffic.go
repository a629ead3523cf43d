package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TrafficChange is what the flags of `traffic` ask for.
type TrafficChange struct {
	To    []spec.TrafficTarget // -to: replaces the percent splits when given
	Tags  map[string]string    // -tag rev=tag: tag -> revision (add or move)
	Untag []string             // -untag tag
}

// apply returns the service's traffic list after the change: splits from -to
// when given (else the current ones), current tags minus -untag, plus -tag.
func (c TrafficChange) apply(current []spec.TrafficTarget) []spec.TrafficTarget {
	var splits []spec.TrafficTarget
	tags := map[string]spec.TrafficTarget{} // tag -> target (Revision or Latest)
	var tagOrder []string
	for _, t := range current {
		if t.Tag != "" {
			tags[t.Tag] = spec.TrafficTarget{Revision: t.Revision, Latest: t.Latest, Tag: t.Tag}
			tagOrder = append(tagOrder, t.Tag)
		}
		if t.Percent > 0 {
			splits = append(splits, spec.TrafficTarget{Revision: t.Revision, Latest: t.Latest, Percent: t.Percent})
		}
	}
	if len(current) == 0 {
		splits = []spec.TrafficTarget{{Latest: true, Percent: 100}}
	}
	if len(c.To) > 0 {
		splits = slices.Clone(c.To)
	}
	for _, tag := range c.Untag {
		delete(tags, tag)
	}
	for tag, rev := range c.Tags {
		t := spec.TrafficTarget{Tag: tag, Revision: rev}
		if rev == "latest" {
			t = spec.TrafficTarget{Tag: tag, Latest: true}
		}
		if _, ok := tags[tag]; !ok {
			tagOrder = append(tagOrder, tag)
		}
		tags[tag] = t
	}
	// Put each tag on the split of its revision when it has one without a
	// tag; otherwise it gets its own entry with no percent.
	out := splits
	slices.Sort(tagOrder)
	tagOrder = slices.Compact(tagOrder)
	for _, tag := range tagOrder {
		t, ok := tags[tag]
		if !ok {
			continue
		}
		placed := false
		for i := range out {
			if out[i].Tag == "" && out[i].Revision == t.Revision && out[i].Latest == t.Latest {
				out[i].Tag = tag
				placed = true
				break
			}
		}
		if !placed {
			out = append(out, t)
		}
	}
	return out
}

// readDeployedRecord reads a service's record, saying that a service
// without one must be deployed first.
func readDeployedRecord(ctx context.Context, consul RecordStore, namespace, service string) (consulroute.Record, uint64, error) {
	rec, idx, err := consul.ReadRecord(ctx, namespace, service)
	if errors.Is(err, consulroute.ErrNotFound) {
		return rec, 0, fmt.Errorf("service %q has no route in namespace %s: deploy it first", service, namespace)
	}
	return rec, idx, err
}

// SetTraffic applies change to the service's record, validated like the
// HCL file and against the revisions that exist, with check-and-set (retried
// when a concurrent deploy or traffic change wins).
func SetTraffic(ctx context.Context, nomad RevisionStore, consul RecordStore, namespace, service string, change TrafficChange) (consulroute.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, idx, err := readDeployedRecord(ctx, consul, namespace, service)
		if err != nil {
			return rec, err
		}
		svc := rec.Service
		svc.Traffic = change.apply(rec.Service.EffectiveTraffic())
		revs, err := nomad.Revisions(ctx, namespace, service)
		if err != nil {
			return rec, err
		}
		known := map[string]bool{}
		for _, r := range revs {
			if !r.Stopped && !slices.Contains(rec.Deleting, r.Name) {
				known[r.Name] = true
			}
		}
		var problems []string
		for _, p := range svc.Validate() {
			if strings.HasPrefix(p.Path, "traffic") {
				problems = append(problems, p.Error())
			}
		}
		for _, p := range spec.ValidateTrafficRevisions(&svc, known) {
			problems = append(problems, p.Error())
		}
		if len(problems) > 0 {
			return rec, fmt.Errorf("the route was not changed:\n  %s", strings.Join(problems, "\n  "))
		}
		rec.Service = svc
		rec.Revisions = MergeRevisions(rec.Revisions, rec.Latest, svc.Traffic)
		if ro := rec.Rollout; ro.InProgress() {
			// A person's traffic wins over a rollout in progress: it stops,
			// and latest means its new revision from now on.
			c := *ro
			c.Phase, c.EndedAt = consulroute.RolloutStopped, time.Now().UTC()
			c.Reason = "traffic was set by a person"
			rec.Rollout = &c
		}
		rec.UpdatedAt = time.Now().UTC()
		err = consul.Publish(ctx, rec, idx)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, consulroute.ErrConflict) || attempt == 4 {
			return rec, err
		}
	}
}
