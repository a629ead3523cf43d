package spec

import "time"

// Metric is what the autoscaler measures.
type Metric string

const (
	// MetricConcurrency is requests in flight per instance (Knative's KPA default).
	MetricConcurrency Metric = "concurrency"
	// MetricRPS is requests per second per instance.
	MetricRPS Metric = "rps"
	// MetricCPU is the serving task's CPU use as a percentage of its
	// reserved CPU, from Nomad's allocation stats (Knative's HPA class).
	MetricCPU Metric = "cpu"
	// MetricMemory is the serving task's memory use as a percentage of
	// its reserved memory, likewise.
	MetricMemory Metric = "memory"
)

// Resource reports whether m is measured from Nomad's resource usage of
// the serving task rather than from requests. Such a revision cannot wake
// from zero on a request, so its floor is 1 (MinResourceScale).
func (m Metric) Resource() bool { return m == MetricCPU || m == MetricMemory }

// MinResourceScale is the least min of a service scaled on CPU or memory,
// as Knative's HPA class has it: with no instance there is nothing to
// measure.
const MinResourceScale = 1

// Unlimited in Scaling.BurstCapacity keeps the activator in the path always.
const Unlimited = -1

// Scaling holds a service's autoscaling settings. They apply to every
// revision of the service and change in place: they are not part of the
// revision's identity.
type Scaling struct {
	// Min and Max bound the instance count; Max 0 means unbounded.
	Min int `json:"min"`
	Max int `json:"max"`
	// Initial is the count a new revision starts with.
	Initial int `json:"initial"`
	// Target is the desired value of Metric per instance.
	Target float64 `json:"target"`
	Metric Metric  `json:"metric"`
	// Utilization is the percentage of Target the autoscaler aims for.
	Utilization float64 `json:"utilization"`
	// Window is the stable window over which the metric is averaged.
	Window time.Duration `json:"window"`
	// PanicWindowPercentage is the panic window as a percentage of Window.
	PanicWindowPercentage float64 `json:"panic_window_percentage"`
	// PanicThresholdPercentage of current capacity in the panic window
	// enters panic mode.
	PanicThresholdPercentage float64 `json:"panic_threshold_percentage"`
	// ScaleToZeroGrace is how long a revision must see no traffic before it
	// goes to zero.
	ScaleToZeroGrace time.Duration `json:"scale_to_zero_grace"`
	// ScaleDownDelay is how long demand must stay low before the count drops.
	ScaleDownDelay time.Duration `json:"scale_down_delay"`
	// BurstCapacity is the spare capacity (in requests) below which the
	// activator stays in the request path; 0 puts it there only at zero,
	// Unlimited (-1) always.
	BurstCapacity float64 `json:"burst_capacity"`
	// ActivationScale is the least count when scaling up from zero.
	ActivationScale int `json:"activation_scale"`
	// MaxScaleUpRate and MaxScaleDownRate bound one step as a ratio of the
	// current count.
	MaxScaleUpRate   float64 `json:"max_scale_up_rate"`
	MaxScaleDownRate float64 `json:"max_scale_down_rate"`
}

// DefaultTarget returns Knative's default target for a metric.
func DefaultTarget(m Metric) float64 {
	switch m {
	case MetricRPS:
		return 200
	case MetricCPU, MetricMemory:
		return 80 // percent of the reservation
	}
	return 100
}

// DefaultScaling returns Knative's defaults (see DESIGN.md).
func DefaultScaling() Scaling {
	return Scaling{
		Min:                      0,
		Max:                      0,
		Initial:                  1,
		Target:                   DefaultTarget(MetricConcurrency),
		Metric:                   MetricConcurrency,
		Utilization:              70,
		Window:                   60 * time.Second,
		PanicWindowPercentage:    10,
		PanicThresholdPercentage: 200,
		ScaleToZeroGrace:         30 * time.Second,
		ScaleDownDelay:           0,
		BurstCapacity:            211,
		ActivationScale:          1,
		MaxScaleUpRate:           1000,
		MaxScaleDownRate:         2,
	}
}

// PanicWindow is the panic window's length.
func (s Scaling) PanicWindow() time.Duration {
	return time.Duration(float64(s.Window) * s.PanicWindowPercentage / 100)
}
