package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// RevisionRow is one revision as `revisions` and `status` show it.
type RevisionRow struct {
	Revision   string    `json:"revision"`
	Generation int       `json:"generation"`
	Created    time.Time `json:"created,omitzero"`
	// Desired is the Nomad group count; Running the allocations running;
	// Ready the instances passing their Consul check.
	Desired int  `json:"desired"`
	Running int  `json:"running"`
	Ready   int  `json:"ready"`
	Stopped bool `json:"stopped,omitempty"`
	// Percent of the service's traffic and Tags routed to it.
	Percent int      `json:"percent"`
	Tags    []string `json:"tags,omitempty"`
	Latest  bool     `json:"latest,omitempty"`
	// RolloutFailed: the service's latest rollout, of this revision,
	// rolled back; it stays deployed at 0 %.
	RolloutFailed bool `json:"rollout_failed,omitempty"`
	// Retained and Why: the garbage collector's verdict.
	Retained bool   `json:"retained"`
	Why      string `json:"why"`
	// Autoscaler is the leader's view, when a control plane runs.
	Autoscaler *autoscaler.RevisionState `json:"autoscaler,omitempty"`
	// LastScaling is the newest scaling event Nomad recorded.
	LastScaling string `json:"last_scaling,omitempty"`
}

// ServiceView is everything `status` shows of a service.
type ServiceView struct {
	Service   string   `json:"service"`
	Namespace string   `json:"namespace"`
	URLs      []string `json:"urls"`
	// Served says on which listener the URLs answer (urls.go): an
	// internal service's on the gateways' internal listener only.
	Served    Where             `json:"served"`
	Latest    string            `json:"latest"`
	Route     consulroute.Route `json:"route"`
	Revisions []RevisionRow     `json:"revisions"`
	// Certificates are the service's names and the certificates the
	// gateways serve for them (certificates.go).
	Certificates []certs.NameStatus `json:"certificates,omitempty"`
	// LastWake is the timeline of the service's newest wake from zero
	// that Nomad's scaling events still hold (any revision's; Nomad keeps
	// a group's last 20 events), when View was asked for events.
	LastWake *spec.WakeTimeline `json:"last_wake,omitempty"`
	// Rollout is the service's latest rollout: its phase, step, reason
	// and history (judgments with both revisions' figures).
	Rollout *consulroute.RolloutRoute `json:"rollout,omitempty"`
}

// Inspector reads what Nomad, Consul and the control plane say of
// services.
type Inspector struct {
	nomad  *nomadjob.Client
	consul *consulroute.Client
	http   *http.Client
	now    time.Time
}

// NewInspector reads through nomad and consul, and judges retention as of
// now.
func NewInspector(nomad *nomadjob.Client, consul *consulroute.Client, now time.Time) *Inspector {
	return &Inspector{nomad: nomad, consul: consul, http: &http.Client{Timeout: 3 * time.Second}, now: now}
}

// Now is the instant retention is judged as of.
func (in *Inspector) Now() time.Time { return in.now }

// Allocations and Health make an Inspector the InstanceReader of
// ExplainNotReady.
func (in *Inspector) Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error) {
	return in.nomad.Allocations(ctx, revision)
}

func (in *Inspector) Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error) {
	return in.consul.Health(ctx, revision)
}

// View builds a service's view; autoscalerState may be nil, and withEvents
// adds the newest scaling event Nomad recorded of each revision the
// autoscaler did not describe, and the service's last wake's timeline
// (which the replica that held the woken request wrote as a scaling event
// of its revision: read with the same token, whichever replica leads).
func (in *Inspector) View(ctx context.Context, namespace, service string, autoscalerState map[string]autoscaler.RevisionState, withEvents bool) (ServiceView, error) {
	decisions, revs, rec, _, err := retention(ctx, in.nomad, in.consul, namespace, service, consulroute.DefaultRetention(), in.now)
	if errors.Is(err, consulroute.ErrNotFound) && len(revs) == 0 {
		return ServiceView{}, fmt.Errorf("service %q not found in namespace %s (see `nomad-serverless list`)", service, namespace)
	}
	if err != nil && !errors.Is(err, consulroute.ErrNotFound) {
		return ServiceView{}, err
	}
	v := ServiceView{Service: service, Namespace: namespace, Latest: rec.Latest, Rollout: rec.Rollout}
	if route, rerr := rec.Route(); rerr == nil && rec.Latest != "" {
		v.Route = route
	}
	why := map[string]consulroute.RetentionDecision{}
	for _, d := range decisions {
		why[d.Revision] = d
	}
	percent := map[string]int{}
	for _, s := range v.Route.Splits {
		percent[s.Revision] += s.Percent
	}
	tags := map[string][]string{}
	for tag, r := range v.Route.Tags {
		tags[r] = append(tags[r], tag)
	}
	for i := len(revs) - 1; i >= 0; i-- { // newest first
		r := revs[i]
		row := RevisionRow{
			Revision: r.Name, Generation: r.Generation, Created: r.Created,
			Desired: r.Desired, Running: r.Running, Stopped: r.Stopped,
			Percent: percent[r.Name], Tags: tags[r.Name], Latest: r.Name == rec.Latest,
			RolloutFailed: rec.Rollout != nil && rec.Rollout.New == r.Name && rec.Rollout.Phase == consulroute.RolloutRolledBack,
			Retained:      true,
		}
		if d, ok := why[r.Name]; ok {
			row.Retained, row.Why = d.Keep, d.Reason
		}
		if !r.Stopped {
			if ready, herr := in.consul.ReadyInstances(ctx, r.Name); herr == nil {
				row.Ready = len(ready)
			}
		}
		if st, ok := autoscalerState[r.Name]; ok {
			row.Autoscaler = &st
		}
		if withEvents && !r.Stopped {
			if evs, eerr := in.nomad.ScalingEvents(ctx, r.Name); eerr == nil {
				wake, last := scalingHistory(r.Name, evs)
				if row.Autoscaler == nil {
					row.LastScaling = last
				}
				if wake != nil && (v.LastWake == nil || wake.Held().After(v.LastWake.Held())) {
					v.LastWake = wake
				}
			}
		}
		v.Revisions = append(v.Revisions, row)
	}
	v.URLs, v.Served = in.urls(ctx, rec)
	v.Certificates = in.Certificates(ctx, namespace, service)
	if !v.Served.Internal {
		// The internal listener has no HTTPS.
		v.URLs = httpsURLs(v.URLs, v.Certificates)
	}
	return v, nil
}

// scalingHistory reads a revision's scaling events (newest first): the
// newest wake timeline among them, and the newest message of an event that
// is not one (the last reason to scale).
func scalingHistory(revision string, evs []nomadjob.ScalingEvent) (wake *spec.WakeTimeline, last string) {
	for _, e := range evs {
		if t, ok := spec.WakeTimelineFromMeta(revision, e.Meta); ok {
			if wake == nil {
				wake = &t
			}
			continue
		}
		if last == "" {
			last = e.Message
		}
	}
	return wake, last
}

// urls are the service's addresses on the running gateways, and where they
// answer; no URLs when the service has no route (no record: no gateway
// answers for it) or no gateway runs.
func (in *Inspector) urls(ctx context.Context, rec consulroute.Record) ([]string, Where) {
	where := Where{Internal: rec.Service.Internal()}
	if rec.Service.Name == "" {
		return nil, where
	}
	gws, err := in.consul.Gateways(ctx)
	if err != nil || len(gws) == 0 {
		return nil, where
	}
	return serviceURLs(rec, gws[0].Domain), WhereServed(where.Internal, gws)
}

// AutoscalerStates asks the leading control-plane replica for its view of a
// service's revisions (all when service is ""). An absent control plane is
// not an error: the map is empty.
func (in *Inspector) AutoscalerStates(ctx context.Context, service string) map[string]autoscaler.RevisionState {
	out := map[string]autoscaler.RevisionState{}
	g, ok, _ := in.consul.LeaderGateway(ctx, consulroute.AutoscalerLockKey)
	if !ok {
		return out
	}
	u := url.URL{Scheme: "http", Host: g.AdminHostPort(), Path: autoscaler.PathRevisions}
	if service != "" {
		u.RawQuery = url.Values{"service": {service}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return out
	}
	resp, err := in.http.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	var states []autoscaler.RevisionState
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&states); err != nil {
		return out
	}
	for _, s := range states {
		out[s.Revision] = s
	}
	return out
}
