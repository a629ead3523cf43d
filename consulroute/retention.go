package consulroute

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// RetentionPolicy decides which old revisions are garbage-collected. A
// revision that carries traffic, has a tag, is the latest or still has
// instances is always kept; the policy applies to the rest, like Knative's
// config-gc (min-non-active-revisions, retain-since-create-time,
// max-non-active-revisions).
type RetentionPolicy struct {
	// KeepRecent: this many of the newest revisions not routed are always
	// kept, whatever their age, so a rollback stays one command away.
	KeepRecent int `json:"keep_recent"`
	// MinAge: a revision not routed is kept until it is this old.
	MinAge time.Duration `json:"min_age"`
	// MaxKept caps the revisions not routed that are kept at all: beyond
	// it the oldest go even if younger than MinAge. 0 means no cap.
	MaxKept int `json:"max_kept"`
}

// DefaultRetention: keep the 3 newest unrouted revisions, delete the
// others once 48 hours old (Knative's retain-since-create-time), and never
// keep more than 20 unrouted ones (each is a Nomad job cluttering `nomad job
// status`; Knative's 1000 suits Kubernetes objects, not jobs).
func DefaultRetention() RetentionPolicy {
	return RetentionPolicy{KeepRecent: 3, MinAge: 48 * time.Hour, MaxKept: 20}
}

// Validate reports a policy that cannot be applied.
func (p RetentionPolicy) Validate() error {
	switch {
	case p.KeepRecent < 0:
		return fmt.Errorf("retention: keep_recent %d is negative", p.KeepRecent)
	case p.MinAge < 0:
		return fmt.Errorf("retention: min_age %s is negative", p.MinAge)
	case p.MaxKept < 0:
		return fmt.Errorf("retention: max_kept %d is negative", p.MaxKept)
	case p.MaxKept != 0 && p.MaxKept < p.KeepRecent:
		return fmt.Errorf("retention: max_kept %d is below keep_recent %d", p.MaxKept, p.KeepRecent)
	}
	return nil
}

// RevisionState is what retention needs to know of one revision.
type RevisionState struct {
	Name       string    `json:"name"`
	Generation int       `json:"generation"`
	Created    time.Time `json:"created"`
	Ready      bool      `json:"ready"`
	// Instances running now (activator stand-ins not counted).
	Instances int `json:"instances"`
}

// RetentionDecision says whether a revision stays, and why.
type RetentionDecision struct {
	Revision string `json:"revision"`
	Keep     bool   `json:"keep"`
	Reason   string `json:"reason"`
}

// Retain decides, for every revision, keep or delete, with the reason shown
// by `revisions`. It is pure: now, the revisions, the route and the latest
// revision's name in, decisions out, newest generation first.
//
// Kept always: routed ("routed 90%"), tagged ("tagged old"), the latest
// ("latest"), still running ("has 2 instances": it is draining or still
// starting). The others, newest first: the first KeepRecent are kept
// ("among the 3 most recent"); past MaxKept they go ("beyond the 20 most
// recent not routed"); younger than MinAge they stay ("younger than 2d");
// the rest go ("older than 2d and not routed").
func Retain(now time.Time, revs []RevisionState, route Route, latest string, p RetentionPolicy) []RetentionDecision {
	sorted := append([]RevisionState(nil), revs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Generation != sorted[j].Generation {
			return sorted[i].Generation > sorted[j].Generation
		}
		return sorted[i].Name > sorted[j].Name
	})
	percent := map[string]int{}
	for _, s := range route.Splits {
		percent[s.Revision] += s.Percent
	}
	tags := map[string][]string{}
	for tag, rev := range route.Tags {
		tags[rev] = append(tags[rev], tag)
	}

	out := make([]RetentionDecision, 0, len(sorted))
	unrouted := 0
	for _, r := range sorted {
		d := RetentionDecision{Revision: r.Name, Keep: true}
		var why []string
		if pc := percent[r.Name]; pc > 0 {
			why = append(why, fmt.Sprintf("routed %d%%", pc))
		}
		if ts := tags[r.Name]; len(ts) > 0 {
			sort.Strings(ts)
			why = append(why, "tagged "+strings.Join(ts, ", "))
		}
		if r.Name == latest {
			why = append(why, "latest")
		}
		if len(why) == 0 && r.Instances > 0 {
			why = append(why, fmt.Sprintf("has %d instance%s", r.Instances, plural(r.Instances)))
		}
		if len(why) > 0 {
			d.Reason = strings.Join(why, ", ")
			out = append(out, d)
			continue
		}
		unrouted++
		age := now.Sub(r.Created)
		switch {
		case unrouted <= p.KeepRecent && p.KeepRecent == 1:
			d.Reason = "the most recent"
		case unrouted <= p.KeepRecent:
			d.Reason = fmt.Sprintf("among the %d most recent", p.KeepRecent)
		case p.MaxKept > 0 && unrouted > p.MaxKept:
			d.Keep = false
			d.Reason = fmt.Sprintf("beyond the %d most recent not routed", p.MaxKept)
		case r.Created.IsZero():
			// Unknown age: never delete on missing data.
			d.Reason = "creation time unknown"
		case age < p.MinAge:
			d.Reason = "younger than " + shortDuration(p.MinAge)
		default:
			d.Keep = false
			d.Reason = "older than " + shortDuration(p.MinAge) + " and not routed"
		}
		out = append(out, d)
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// shortDuration writes whole days as "7d" and whole hours as "15h".
func shortDuration(d time.Duration) string {
	switch {
	case d > 0 && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d > 0 && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}
