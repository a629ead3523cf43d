package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

// Shared by the commands that show services: revisions, status, list.

// newInspector is a rollout.Inspector over clients configured from the
// environment, judging retention as of now.
func newInspector() (*rollout.Inspector, error) {
	nomad, consul, err := newClients()
	if err != nil {
		return nil, err
	}
	return rollout.NewInspector(nomad, consul, time.Now()), nil
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

func trafficCell(r rollout.RevisionRow) string {
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
	if r.RolloutFailed {
		parts = append(parts, "rollout failed")
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
