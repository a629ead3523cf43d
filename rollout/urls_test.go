package rollout

import (
	"slices"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestWhereServed(t *testing.T) {
	gws := []consulroute.Gateway{
		{ID: "a", Address: "10.0.0.1", Port: 8080},
		{ID: "b", Address: "10.0.0.2", Port: 8080, Internal: "10.1.0.2:8082"},
	}
	if w := WhereServed(false, gws); w.Internal || w.Listener != "10.0.0.1:8080" {
		t.Errorf("public: %+v, want the first gateway's port", w)
	}
	w := WhereServed(true, gws)
	if !w.Internal || w.Listener != "10.1.0.2:8082" || !strings.Contains(w.String(), "internal listener (10.1.0.2:8082)") {
		t.Errorf("internal: %+v %q, want the first internal listener", w, w)
	}
	w = WhereServed(true, gws[:1])
	if !w.Internal || w.Listener != "" || !strings.Contains(w.String(), "-internal-listen") {
		t.Errorf("internal without a listener: %+v %q", w, w)
	}
}

func TestServiceURLsListEveryName(t *testing.T) {
	s := spec.NewService("billing")
	s.Visibility = spec.VisibilityInternal
	s.Domains = []string{"billing.corp.example"}
	s.Traffic = []spec.TrafficTarget{{Latest: true, Percent: 100}, {Revision: "billing-00001", Tag: "old"}}
	rec := consulroute.Record{Service: s, Latest: "billing-00002", Revisions: []string{"billing-00001", "billing-00002"}}
	got := serviceURLs(rec, "apps.example.com")
	want := []string{"http://billing.default.apps.example.com/", "http://billing.corp.example/", "http://old-billing.default.apps.example.com/"}
	if !slices.Equal(got, want) {
		t.Errorf("URLs %q, want %q", got, want)
	}
}
