package rollout

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// MergeRevisions is the published set after routing latest: what was
// published, latest, and every revision the traffic names.
func MergeRevisions(have []string, latest string, traffic []spec.TrafficTarget) []string {
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

// DescribeTraffic is a record's route on one line (see DescribeRoute).
func DescribeTraffic(rec consulroute.Record) string {
	route, err := rec.Route()
	if err != nil {
		return "invalid: " + err.Error()
	}
	return DescribeRoute(route)
}

// DescribeRoute is a route on one line, as deploy, traffic, render and
// status print it: "hello-00001 90%, hello-00002 10%, tag old -> hello-00001".
func DescribeRoute(r consulroute.Route) string {
	parts := make([]string, 0, len(r.Splits)+len(r.Tags))
	for _, sp := range r.Splits {
		parts = append(parts, fmt.Sprintf("%s %d%%", sp.Revision, sp.Percent))
	}
	for _, tag := range sortedTags(r.Tags) {
		parts = append(parts, fmt.Sprintf("tag %s -> %s", tag, r.Tags[tag]))
	}
	return strings.Join(parts, ", ")
}

func sortedTags(tags map[string]string) []string {
	out := make([]string, 0, len(tags))
	for t := range tags {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}
