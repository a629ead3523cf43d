package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// trafficChange is what the flags of `traffic` ask for.
type trafficChange struct {
	to    []spec.TrafficTarget // -to: replaces the percent splits when given
	tags  map[string]string    // -tag rev=tag: tag -> revision (add or move)
	untag []string             // -untag tag
}

// apply returns the service's traffic list after the change: splits from -to
// when given (else the current ones), current tags minus -untag, plus -tag.
func (c trafficChange) apply(current []spec.TrafficTarget) []spec.TrafficTarget {
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
	if len(c.to) > 0 {
		splits = slices.Clone(c.to)
	}
	for _, tag := range c.untag {
		delete(tags, tag)
	}
	for tag, rev := range c.tags {
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

func runTraffic(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "traffic", `Usage: nomad-serverless traffic [options] <service>

Changes how a service's traffic splits over its revisions, in place:
  nomad-serverless traffic hello -to hello-00003=10 -to hello-00002=90   # canary
  nomad-serverless traffic hello -to latest=100 -tag hello-00002=old
-to replaces every split (percentages add to 100); -tag and -untag change one tag
each and keep the others. The next deploy of the service's file sets traffic
back to what the file says.

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	asJSON := fs.Bool("json", false, "print the new route as JSON")
	var change trafficChange
	change.tags = map[string]string{}
	fs.Func("to", "send `revision=percent` of traffic to a revision (or latest=percent); repeatable", func(s string) error {
		rev, pct, ok := strings.Cut(s, "=")
		n, err := strconv.Atoi(pct)
		if !ok || rev == "" || err != nil {
			return fmt.Errorf("want revision=percent, for example -to hello-00002=90 or -to latest=10")
		}
		t := spec.TrafficTarget{Revision: rev, Percent: n}
		if rev == "latest" {
			t = spec.TrafficTarget{Latest: true, Percent: n}
		}
		change.to = append(change.to, t)
		return nil
	})
	fs.Func("tag", "tag a revision: `revision=tag` routes <tag>-<service>.<ns>.<domain> to it; repeatable", func(s string) error {
		rev, tag, ok := strings.Cut(s, "=")
		if !ok || rev == "" || tag == "" {
			return fmt.Errorf("want revision=tag, for example -tag hello-00002=old")
		}
		change.tags[tag] = rev
		return nil
	})
	fs.Func("untag", "remove a `tag`; repeatable", func(s string) error {
		change.untag = append(change.untag, s)
		return nil
	})
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 1 || (len(change.to) == 0 && len(change.tags) == 0 && len(change.untag) == 0) {
		fs.Usage()
		return exitUsage
	}
	service := rest[0]
	in, err := newInspector()
	if err != nil {
		return errorLine(e, "traffic", err)
	}
	rec, err := setTraffic(ctx, in, *namespace, service, change)
	if err != nil {
		return errorLine(e, "traffic", err)
	}
	route, _ := rec.Route()
	if *asJSON {
		if err := writeJSON(e.stdout, route); err != nil {
			return errorLine(e, "traffic", err)
		}
	} else {
		fmt.Fprintf(e.stdout, "%s: route published (%s)\n", service, describeTraffic(rec))
	}
	gone, err := collectRevisions(ctx, in.nomad, in.consul, *namespace, service, consulroute.DefaultRetention(), time.Now())
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: could not collect old revisions: %v\n", service, err)
	}
	for _, g := range gone {
		fmt.Fprintf(e.stderr, "%s: deleted old revision %s (%s)\n", service, g.Revision, g.Reason)
	}
	return exitOK
}

// setTraffic applies change to the service's record, validated like the
// HCL file and against the revisions that exist, with check-and-set (retried
// when a concurrent deploy or traffic change wins).
func setTraffic(ctx context.Context, in *inspector, namespace, service string, change trafficChange) (consulroute.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, idx, err := in.consul.ReadRecord(ctx, namespace, service)
		if errors.Is(err, consulroute.ErrNotFound) {
			return rec, fmt.Errorf("service %q has no route in namespace %s: deploy it first", service, namespace)
		}
		if err != nil {
			return rec, err
		}
		svc := rec.Service
		svc.Traffic = change.apply(rec.Service.EffectiveTraffic())
		revs, err := in.nomad.Revisions(ctx, namespace, service)
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
		rec.Revisions = mergeRevisions(rec.Revisions, rec.Latest, svc.Traffic)
		rec.UpdatedAt = time.Now().UTC()
		err = in.consul.Publish(ctx, rec, idx)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, consulroute.ErrConflict) || attempt == 4 {
			return rec, err
		}
	}
}
