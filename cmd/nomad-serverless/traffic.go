package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

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
	var change rollout.TrafficChange
	change.Tags = map[string]string{}
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
		change.To = append(change.To, t)
		return nil
	})
	fs.Func("tag", "tag a revision: `revision=tag` routes <tag>-<service>.<ns>.<domain> to it; repeatable", func(s string) error {
		rev, tag, ok := strings.Cut(s, "=")
		if !ok || rev == "" || tag == "" {
			return fmt.Errorf("want revision=tag, for example -tag hello-00002=old")
		}
		change.Tags[tag] = rev
		return nil
	})
	fs.Func("untag", "remove a `tag`; repeatable", func(s string) error {
		change.Untag = append(change.Untag, s)
		return nil
	})
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 1 || (len(change.To) == 0 && len(change.Tags) == 0 && len(change.Untag) == 0) {
		fs.Usage()
		return exitUsage
	}
	service := rest[0]
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "traffic", err)
	}
	rec, err := rollout.SetTraffic(ctx, nomad, consul, *namespace, service, change)
	if err != nil {
		return errorLine(e, "traffic", err)
	}
	route, _ := rec.Route()
	if *asJSON {
		if err := writeJSON(e.stdout, route); err != nil {
			return errorLine(e, "traffic", err)
		}
	} else {
		fmt.Fprintf(e.stdout, "%s: route published (%s)\n", service, rollout.DescribeTraffic(rec))
	}
	gone, err := rollout.Collect(ctx, nomad, consul, *namespace, service, consulroute.DefaultRetention(), time.Now())
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: could not collect old revisions: %v\n", service, err)
	}
	for _, g := range gone {
		fmt.Fprintf(e.stderr, "%s: deleted old revision %s (%s)\n", service, g.Revision, g.Reason)
	}
	return exitOK
}
