package tracing

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.yaml.in/yaml/v3"
)

// The dashboard links exemplars to traces: the Grafana data sources we
// ship (deploy/grafana-datasources.yml) turn the exemplar label the
// histograms carry (Exemplar) into a link to a tracing data source, and
// every latency query of the dashboard asks for exemplars.
func TestDashboardLinksExemplarsToTraces(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: newTraceID(), SpanID: newSpanID(), TraceFlags: trace.FlagsSampled})
	var label string
	for k := range Exemplar(sc) {
		label = k
	}

	b, err := os.ReadFile("../deploy/grafana-datasources.yml")
	if err != nil {
		t.Fatal(err)
	}
	var prov struct {
		Datasources []struct {
			Name, UID, Type string
			JSONData        struct {
				Destinations []struct {
					Name          string `yaml:"name"`
					DatasourceUID string `yaml:"datasourceUid"`
				} `yaml:"exemplarTraceIdDestinations"`
			} `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(b, &prov); err != nil {
		t.Fatalf("grafana-datasources.yml: %v", err)
	}
	tracingUIDs := map[string]bool{}
	for _, ds := range prov.Datasources {
		switch ds.Type {
		case "jaeger", "tempo", "zipkin":
			tracingUIDs[ds.UID] = true
		}
	}
	linked := false
	for _, ds := range prov.Datasources {
		if ds.Type != "prometheus" {
			continue
		}
		for _, d := range ds.JSONData.Destinations {
			if d.Name == label && tracingUIDs[d.DatasourceUID] {
				linked = true
			}
		}
	}
	if !linked {
		t.Errorf("grafana-datasources.yml: no Prometheus data source links exemplar label %q to a tracing data source (%+v)", label, prov.Datasources)
	}

	b, err = os.ReadFile("../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr     string `json:"expr"`
				Exemplar bool   `json:"exemplar"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	latency := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, "_request_duration_seconds_bucket") {
				continue
			}
			latency++
			if !tg.Exemplar {
				t.Errorf("panel %q: query %s does not ask for exemplars", p.Title, tg.Expr)
			}
		}
	}
	if latency == 0 {
		t.Error("the dashboard has no latency query")
	}
}
