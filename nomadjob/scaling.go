package nomadjob

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// PolicyKey is the key of our settings inside the group's scaling policy.
//
// A revision's scaling settings live in the group's scaling block, not in
// job meta: Nomad treats a job-meta change as a destructive update (meta is
// in every task's NOMAD_META_ environment) while the scaling policy is
// stored opaquely and changing it replaces no allocation. Scaling settings
// must change in place, so they go here. The block's Max is the bound
// Nomad itself enforces on every scale call, its Min is 0 (scalingBlock);
// Enabled is false so the Nomad Autoscaler, if one runs, leaves our jobs
// alone.
const PolicyKey = "serverless"

// scalingPolicy is spec.Scaling as stored in the policy: every field, with
// durations written as Go duration strings so the policy reads well in
// `nomad job inspect` and survives Nomad's storage unchanged.
type scalingPolicy struct {
	Min                      int         `json:"min"`
	Max                      int         `json:"max"`
	Initial                  int         `json:"initial"`
	Target                   float64     `json:"target"`
	Metric                   spec.Metric `json:"metric"`
	Utilization              float64     `json:"utilization"`
	Window                   string      `json:"window"`
	PanicWindowPercentage    float64     `json:"panic_window_percentage"`
	PanicThresholdPercentage float64     `json:"panic_threshold_percentage"`
	ScaleToZeroGrace         string      `json:"scale_to_zero_grace"`
	ScaleDownDelay           string      `json:"scale_down_delay"`
	BurstCapacity            float64     `json:"burst_capacity"`
	ActivationScale          int         `json:"activation_scale"`
	MaxScaleUpRate           float64     `json:"max_scale_up_rate"`
	MaxScaleDownRate         float64     `json:"max_scale_down_rate"`
}

func toPolicy(s spec.Scaling) scalingPolicy {
	return scalingPolicy{
		Min: s.Min, Max: s.Max, Initial: s.Initial,
		Target: s.Target, Metric: s.Metric, Utilization: s.Utilization,
		Window:                   s.Window.String(),
		PanicWindowPercentage:    s.PanicWindowPercentage,
		PanicThresholdPercentage: s.PanicThresholdPercentage,
		ScaleToZeroGrace:         s.ScaleToZeroGrace.String(),
		ScaleDownDelay:           s.ScaleDownDelay.String(),
		BurstCapacity:            s.BurstCapacity,
		ActivationScale:          s.ActivationScale,
		MaxScaleUpRate:           s.MaxScaleUpRate,
		MaxScaleDownRate:         s.MaxScaleDownRate,
	}
}

func (p scalingPolicy) scaling() (spec.Scaling, error) {
	var errs []error
	dur := func(name, v string) time.Duration {
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q is not a duration", name, v))
		}
		return d
	}
	s := spec.Scaling{
		Min: p.Min, Max: p.Max, Initial: p.Initial,
		Target: p.Target, Metric: p.Metric, Utilization: p.Utilization,
		Window:                   dur("window", p.Window),
		PanicWindowPercentage:    p.PanicWindowPercentage,
		PanicThresholdPercentage: p.PanicThresholdPercentage,
		ScaleToZeroGrace:         dur("scale_to_zero_grace", p.ScaleToZeroGrace),
		ScaleDownDelay:           dur("scale_down_delay", p.ScaleDownDelay),
		BurstCapacity:            p.BurstCapacity,
		ActivationScale:          p.ActivationScale,
		MaxScaleUpRate:           p.MaxScaleUpRate,
		MaxScaleDownRate:         p.MaxScaleDownRate,
	}
	return s, errors.Join(errs...)
}

// policyMap is the policy as the map Nomad stores. It fails only for
// values JSON cannot carry (NaN or infinite numbers).
func policyMap(s spec.Scaling) (map[string]any, error) {
	b, err := json.Marshal(toPolicy(s))
	if err != nil {
		return nil, fmt.Errorf("scaling settings cannot be stored in Nomad: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("scaling settings cannot be stored in Nomad: %w", err)
	}
	return map[string]any{PolicyKey: m}, nil
}

// nomadBounds are the scaling block's Min and Max for s: Max 0 (unbounded)
// becomes unbounded.
func nomadBounds(s spec.Scaling, unbounded int) (lo, hi int) {
	hi = s.Max
	if hi == 0 {
		hi = unbounded
	}
	return s.Min, hi
}

// scalingBlock is the group's scaling block for s.
func scalingBlock(s spec.Scaling, unbounded int) (*api.ScalingPolicy, error) {
	pol, err := policyMap(s)
	if err != nil {
		return nil, err
	}
	_, hi := nomadBounds(s, unbounded)
	return &api.ScalingPolicy{
		// Min is 0 whatever the revision's min: the autoscaler holds
		// min, and lets a revision no route reaches go to zero
		// (catalog.Revision.Unreachable), which Nomad would refuse
		// below a bound of min. Max stays Nomad's to enforce.
		Min:     new(int64(0)),
		Max:     new(int64(hi)),
		Enabled: new(false),
		Policy:  pol,
	}, nil
}

// ErrNoScalingPolicy is returned by ScalingFromJob for a job whose group
// has no scaling policy of ours.
var ErrNoScalingPolicy = errors.New("the job's group has no nomad-serverless scaling policy")

// ScalingFromJob reads a revision's scaling settings back from its group's
// scaling policy. It is the inverse of what Compile writes: whatever went
// through Nomad's storage (numbers come back as float64) reads back equal.
func ScalingFromJob(job *api.Job) (spec.Scaling, error) {
	g := appGroup(job)
	if g == nil {
		return spec.Scaling{}, fmt.Errorf("read scaling of job %s: no group %q", jobID(job), spec.GroupName)
	}
	if g.Scaling == nil || g.Scaling.Policy == nil || g.Scaling.Policy[PolicyKey] == nil {
		return spec.Scaling{}, fmt.Errorf("read scaling of job %s: %w", jobID(job), ErrNoScalingPolicy)
	}
	b, err := json.Marshal(g.Scaling.Policy[PolicyKey])
	if err != nil {
		return spec.Scaling{}, fmt.Errorf("read scaling of job %s: %w", jobID(job), err)
	}
	var p scalingPolicy
	if err := json.Unmarshal(b, &p); err != nil {
		return spec.Scaling{}, fmt.Errorf("read scaling of job %s: policy %q: %w", jobID(job), PolicyKey, err)
	}
	s, err := p.scaling()
	if err != nil {
		return spec.Scaling{}, fmt.Errorf("read scaling of job %s: policy %q: %w", jobID(job), PolicyKey, err)
	}
	return s, nil
}

// appGroup returns the job's group "app", or nil.
func appGroup(job *api.Job) *api.TaskGroup {
	if job == nil {
		return nil
	}
	for _, g := range job.TaskGroups {
		if g != nil && g.Name != nil && *g.Name == spec.GroupName {
			return g
		}
	}
	return nil
}

func jobID(job *api.Job) string {
	if job == nil || job.ID == nil {
		return "<no id>"
	}
	return *job.ID
}
