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
	var m map[string]any
	if len(meta) > 0 {
		m = make(map[string]any, len(meta))
		for k, v := range meta {
			m[k] = v
		}
	}
	if _, _, err := c.api.Jobs().Scale(revision, spec.GroupName, &count, reason, false, m, c.write(ctx, ns)); err != nil {
		return c.wrap(op, ns, capScale, err)
	}
	return nil
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
				fmt.Sprintf("scaling bounds changed to %d..%d: count %d moved into them (%d)", lo, hi, current, target))
		}
		return nil
	}
}

// recordScalingEvent adds a message to the revision's scaling history
// without changing its count (a scale request without Count). The count
// has already changed; failing to explain it is logged, not returned.
func (c *Client) recordScalingEvent(ctx context.Context, revision, ns, message string) {
	req := &api.ScalingRequest{
		Target:  map[string]string{"Job": revision, "Group": spec.GroupName},
		Message: message,
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
