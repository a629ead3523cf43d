package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Shared by the commands that show services: revisions, status, list.

// revisionRow is one revision as `revisions` and `status` show it.
type revisionRow struct {
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
	// Retained and Why: the garbage collector's verdict.
	Retained bool   `json:"retained"`
	Why      string `json:"why"`
	// Autoscaler is the leader's view, when a control plane runs.
	Autoscaler *autoscaler.RevisionState `json:"autoscaler,omitempty"`
	// LastScaling is the newest scaling event Nomad recorded.
	LastScaling string `json:"last_scaling,omitempty"`
}

// serviceView is everything `status` shows of a service.
type serviceView struct {
	Service   string            `json:"service"`
	Namespace string            `json:"namespace"`
	URLs      []string          `json:"urls"`
	Latest    string            `json:"latest"`
	Route     consulroute.Route `json:"route"`
	Revisions []revisionRow     `json:"revisions"`
}

// inspector reads what Nomad, Consul and the control plane say of services.
type inspector struct {
	nomad  *nomadjob.Client
	consul *consulroute.Client
	http   *http.Client
	now    time.Time
}

func newInspector() (*inspector, error) {
	n, err := newNomad()
	if err != nil {
		return nil, err
	}
	c, err := newConsul()
	if err != nil {
		return nil, err
	}
	return &inspector{nomad: n, consul: c, http: &http.Client{Timeout: 3 * time.Second}, now: time.Now()}, nil
}

// view builds a service's view; autoscalerState may be nil.
func (in *inspector) view(ctx context.Context, namespace, service string, autoscalerState map[string]autoscaler.RevisionState, withEvents bool) (serviceView, error) {
	decisions, revs, rec, _, err := retention(ctx, in.nomad, in.consul, namespace, service, consulroute.DefaultRetention(), in.now)
	if errors.Is(err, consulroute.ErrNotFound) && len(revs) == 0 {
		return serviceView{}, fmt.Errorf("service %q not found in namespace %s (see `nomad-serverless list`)", service, namespace)
	}
	if err != nil && !errors.Is(err, consulroute.ErrNotFound) {
		return serviceView{}, err
	}
	v := serviceView{Service: service, Namespace: namespace, Latest: rec.Latest}
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
		row := revisionRow{
			Revision: r.Name, Generation: r.Generation, Created: r.Created,
			Desired: r.Desired, Running: r.Running, Stopped: r.Stopped,
			Percent: percent[r.Name], Tags: tags[r.Name], Latest: r.Name == rec.Latest,
			Retained: true,
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
		if withEvents && row.Autoscaler == nil {
			if evs, eerr := in.nomad.ScalingEvents(ctx, r.Name); eerr == nil && len(evs) > 0 {
				row.LastScaling = evs[0].Message
			}
		}
		v.Revisions = append(v.Revisions, row)
	}
	v.URLs = in.urls(ctx, rec)
	return v, nil
}

// urls are the service's addresses on the running gateways; none when the
// service has no route (no record): no gateway answers for it.
func (in *inspector) urls(ctx context.Context, rec consulroute.Record) []string {
	if rec.Service.Name == "" {
		return nil
	}
	gws, err := in.consul.Gateways(ctx)
	if err != nil || len(gws) == 0 {
		return nil
	}
	svc := rec.Service
	ns := rec.Namespace()
	out := []string{fmt.Sprintf("http://%s.%s.%s/", svc.Name, ns, gws[0].Domain)}
	for _, d := range svc.Domains {
		out = append(out, "http://"+d+"/")
	}
	if route, err := rec.Route(); err == nil {
		for _, tag := range sortedTags(route.Tags) {
			out = append(out, fmt.Sprintf("http://%s-%s.%s.%s/", tag, svc.Name, ns, gws[0].Domain))
		}
	}
	return out
}

// autoscalerStates asks the leading control-plane replica for its view of a
// service's revisions (all when service is ""). An absent control plane is
// not an error: the map is empty.
func (in *inspector) autoscalerStates(ctx context.Context, service string) map[string]autoscaler.RevisionState {
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

// writeJSON prints v indented.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func trafficCell(r revisionRow) string {
	var parts []string
	if r.Percent > 0 {
		parts = append(parts, fmt.Sprintf("%d%%", r.Percent))
	}
	for _, t := range r.Tags {
		parts = append(parts, "tag "+t)
	}
	if r.Latest {
		parts = append(parts, "latest")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// namespaceFlagDefault is NOMAD_NAMESPACE or "default", like the nomad CLI.
func namespaceFlagDefault(getenv func(string) string) string {
	if ns := getenv("NOMAD_NAMESPACE"); ns != "" {
		return ns
	}
	return "default"
}
