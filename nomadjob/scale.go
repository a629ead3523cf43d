package nomadjob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scale sets a revision's instance count (group "app"). reason is shown in
// `nomad job scaling-events`; meta carries the numbers behind it. Nomad
// refuses a count outside the scaling block (ErrOutOfBounds) and an unknown
// revision (ErrNotFound); IsTransient tells the errors worth retrying.
// Client satisfies autoscaler.Scaler.
func (c *Client) Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error {
	op := fmt.Sprintf("scale revision %s to %d", revision, count)
	if count < 0 {
		return fmt.Errorf("%s: a count cannot be negative", op)
	}
	ns := c.namespaceOf(revision)
	if _, _, err := c.api.Jobs().Scale(revision, spec.GroupName, &count, reason, false, anyMeta(meta), c.write(ctx, ns)); err != nil {
		return c.wrap(op, ns, capScale, err)
	}
	return nil
}

// RecordScalingEvent adds message and meta to a revision's scaling
// history without changing its count: Nomad's scale endpoint with no
// count writes the event alone (no new job version, no evaluation). The
// gateway keeps each wake's timeline this way, where `nomad job
// scaling-events` and `nomad-serverless status` read it. It needs what
// Scale needs (scale-job).
func (c *Client) RecordScalingEvent(ctx context.Context, revision, message string, meta map[string]string) error {
	ns := c.namespaceOf(revision)
	if _, _, err := c.api.Jobs().Scale(revision, spec.GroupName, nil, message, false, anyMeta(meta), c.write(ctx, ns)); err != nil {
		return c.wrap("record a scaling event of revision "+revision, ns, capScale, err)
	}
	return nil
}

// ScaleAtLeast raises a revision's count to n (at most the scaling block's
// max) unless it already is at least n, and never lowers it: the wake of a
// revision at zero that any control-plane replica may make, concurrently
// with the others and with the leader's own scale calls. raised tells
// whether this call changed the count. reason and meta go to the
// revision's scaling history.
//
// Nomad 1.6's scale endpoint has no check-index, so "at least" is made
// safe the way UpdateScaling is: read the job, and if its count is below
// n, register it with that count enforcing the job modify index read. A
// write by anyone in between (the leader scaling it higher, another
// replica's wake) makes Nomad refuse it ("conflicting job modify index");
// the job is read again and, its count now being at least n, left alone.
//
// Registering needs submit-job, which the control plane's shipped ACL
// policy leaves out on purpose (it never registers jobs). Refused that, it
// falls back to the scale endpoint with the job modify index read (Nomad
// 1.8.2 and later enforce it, and a conflict is retried the same way;
// older versions ignore it, and then only the read just before guards the
// count: a count someone raised within that round trip may be set back to
// n, until the leader's next decision).
func (c *Client) ScaleAtLeast(ctx context.Context, revision string, n int, reason string, meta map[string]string) (raised bool, err error) {
	op := fmt.Sprintf("raise revision %s to at least %d", revision, n)
	if n < 1 {
		return false, fmt.Errorf("%s: the count to raise to must be at least 1", op)
	}
	for attempt := 0; ; attempt++ {
		job, err := c.Job(ctx, revision)
		if err != nil {
			return false, fmt.Errorf("%s: %w", op, err)
		}
		g := appGroup(job)
		switch {
		case g == nil:
			return false, fmt.Errorf("%s: the job has no group %q", op, spec.GroupName)
		case deref(job.Stop, false):
			// Stopped on purpose (deploy gave up on it, or delete):
			// a request must not bring it back.
			return false, fmt.Errorf("%s: the job is stopped", op)
		case job.JobModifyIndex == nil:
			return false, fmt.Errorf("%s: Nomad returned the job without a JobModifyIndex", op)
		}
		current, target := deref(g.Count, 0), n
		if g.Scaling != nil && g.Scaling.Max != nil && int64(target) > *g.Scaling.Max {
			target = int(*g.Scaling.Max)
		}
		if current >= target {
			return false, nil
		}
		ns := deref(job.Namespace, c.namespaceOf(revision))
		jmi := *job.JobModifyIndex
		msg := fmt.Sprintf("%s (raised from %d to %d)", reason, current, target)
		g.Count = new(target)
		_, _, err = c.api.Jobs().RegisterOpts(job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: jmi}, c.write(ctx, ns))
		werr := c.wrap(op, ns, capSubmit, err)
		if errors.Is(werr, ErrPermission) {
			werr = c.scaleAt(ctx, revision, ns, target, jmi, msg, meta, op)
		} else if werr == nil {
			c.recordScalingEvent(ctx, revision, ns, msg, meta)
		}
		switch {
		case werr == nil:
			return true, nil
		case errors.Is(werr, ErrConflict) && attempt < c.conflictRetries:
			continue
		}
		return false, werr
	}
}

// scaleAt scales with the job modify index read as the guard (Nomad 1.8.2
// and later check it).
func (c *Client) scaleAt(ctx context.Context, revision, ns string, count int, jmi uint64, message string, meta map[string]string, op string) error {
	req := &api.ScalingRequest{
		Count:          new(int64(count)),
		Target:         map[string]string{"Job": revision, "Group": spec.GroupName},
		Message:        message,
		Meta:           anyMeta(meta),
		JobModifyIndex: jmi,
	}
	_, _, err := c.api.Jobs().ScaleWithRequest(revision, req, c.write(ctx, ns))
	return c.wrap(op, ns, capScale, err)
}

func anyMeta(meta map[string]string) map[string]any {
	if len(meta) == 0 {
		return nil
	}
	m := make(map[string]any, len(meta))
	for k, v := range meta {
		m[k] = v
	}
	return m
}

// ScalingEvent is one entry of a revision's scaling history, newest first.
type ScalingEvent struct {
	Time time.Time `json:"time"`
	// Count is the new count, nil for an event that only recorded a
	// message; PreviousCount the count before.
	Count         *int              `json:"count,omitempty"`
	PreviousCount int               `json:"previous_count"`
	Message       string            `json:"message"`
	Error         bool              `json:"error,omitempty"`
	Meta          map[string]string `json:"meta,omitempty"`
	EvalID        string            `json:"eval_id,omitempty"`
}

// ScalingEvents returns the scaling history Nomad keeps for a revision
// (its most recent events), newest first.
func (c *Client) ScalingEvents(ctx context.Context, revision string) ([]ScalingEvent, error) {
	ns := c.namespaceOf(revision)
	st, _, err := c.api.Jobs().ScaleStatus(revision, c.query(ctx, ns))
	if err != nil {
		return nil, c.wrap("read scaling events of revision "+revision, ns, capRead, err)
	}
	g, ok := st.TaskGroups[spec.GroupName]
	if !ok {
		return nil, fmt.Errorf("read scaling events of revision %s: the job has no group %q", revision, spec.GroupName)
	}
	out := make([]ScalingEvent, 0, len(g.Events))
	for _, e := range g.Events {
		ev := ScalingEvent{
			Time:          time.Unix(0, int64(e.Time)).UTC(),
			PreviousCount: int(e.PreviousCount),
			Message:       e.Message,
			Error:         e.Error,
		}
		if e.Count != nil {
			ev.Count = new(int(*e.Count))
		}
		if e.EvalID != nil {
			ev.EvalID = *e.EvalID
		}
		if len(e.Meta) > 0 {
			ev.Meta = make(map[string]string, len(e.Meta))
			for k, v := range e.Meta {
				if s, ok := v.(string); ok {
					ev.Meta[k] = s
				} else {
					b, _ := json.Marshal(v)
					ev.Meta[k] = string(b)
				}
			}
		}
		out = append(out, ev)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.After(out[j].Time) })
	return out, nil
}

// UpdateScaling changes a revision's scaling settings in place: only the
// group's scaling block (min, max and our policy) changes, which Nomad
// applies without replacing any allocation. It re-registers the job it
// read, enforcing that job's modify index, and re-reads and retries a few
// times when someone else changed the job in between (an autoscaler's
// scale call, for instance).
//
// Nothing is clamped silently: when the current count lies outside the new
// bounds, the same registration sets the count to the nearest bound (it is
// atomic with the bounds, thanks to the enforced index) and a scaling event
// records why. Otherwise the count is preserved. Settings equal to the
// job's change nothing.
func (c *Client) UpdateScaling(ctx context.Context, revision string, s spec.Scaling) error {
	op := "update scaling of revision " + revision
	lo, hi := nomadBounds(s, c.unboundedMax)
	if lo < 0 || lo > hi {
		return fmt.Errorf("%s: min %d is outside 0..%d", op, lo, hi)
	}
	for attempt := 0; ; attempt++ {
		job, err := c.Job(ctx, revision)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if _, err := RevisionFromJob(job); errors.Is(err, ErrNotOurs) {
			return fmt.Errorf("%s: %w", op, err)
		}
		g := appGroup(job)
		if g == nil {
			return fmt.Errorf("%s: the job has no group %q", op, spec.GroupName)
		}
		if job.JobModifyIndex == nil {
			return fmt.Errorf("%s: Nomad returned the job without a JobModifyIndex", op)
		}
		current := deref(g.Count, 0)
		target := min(max(current, lo), hi)
		block, err := scalingBlock(s, c.unboundedMax)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if sameScaling(g.Scaling, block) && target == current {
			return nil
		}
		if old := g.Scaling; old != nil {
			// Keep the policy's identity; Nomad matches it by target
			// anyway, but an unchanged ID reads better in its history.
			block.ID, block.Type = old.ID, old.Type
		}
		g.Scaling = block
		g.Count = new(target)
		ns := deref(job.Namespace, c.namespaceOf(revision))
		opts := &api.RegisterOptions{EnforceIndex: true, ModifyIndex: *job.JobModifyIndex, PreserveCounts: target == current}
		_, _, err = c.api.Jobs().RegisterOpts(job, opts, c.write(ctx, ns))
		if err != nil {
			werr := c.wrap(op, ns, capSubmit, err)
			if errors.Is(werr, ErrConflict) && attempt < c.conflictRetries {
				continue
			}
			return werr
		}
		if target != current {
			c.recordScalingEvent(ctx, revision, ns,
				fmt.Sprintf("scaling bounds changed to %d..%d: count %d moved into them (%d)", lo, hi, current, target), nil)
		}
		return nil
	}
}

// recordScalingEvent adds a message to the revision's scaling history
// without changing its count (a scale request without Count). The count
// has already changed; failing to explain it is logged, not returned.
func (c *Client) recordScalingEvent(ctx context.Context, revision, ns, message string, meta map[string]string) {
	req := &api.ScalingRequest{
		Target:  map[string]string{"Job": revision, "Group": spec.GroupName},
		Message: message,
		Meta:    anyMeta(meta),
	}
	if _, _, err := c.api.Jobs().ScaleWithRequest(revision, req, c.write(ctx, ns)); err != nil {
		c.log.Warn("could not record a scaling event", "revision", revision, "message", message, "err", c.wrap("record scaling event of revision "+revision, ns, capScale, err))
	}
}

// sameScaling reports whether a job's scaling block already says what b
// says (bounds, enabled and policy, compared as Nomad stores them).
func sameScaling(old, b *api.ScalingPolicy) bool {
	if old == nil {
		return false
	}
	if deref(old.Min, -1) != deref(b.Min, -2) || deref(old.Max, -1) != deref(b.Max, -2) || deref(old.Enabled, true) != deref(b.Enabled, false) {
		return false
	}
	return reflect.DeepEqual(jsonNormal(old.Policy), jsonNormal(b.Policy))
}

// jsonNormal round-trips v through JSON so values compare the way Nomad
// returns them (numbers as float64).
func jsonNormal(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return v
	}
	return out
}
