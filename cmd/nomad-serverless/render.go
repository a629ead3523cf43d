package main

import (
	"context"
	"fmt"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// renderedService is what `render` prints for one service.
type renderedService struct {
	Service       string                  `json:"service"`
	Revision      string                  `json:"revision"`
	Job           *nomadapi.Job           `json:"job"`
	Route         consulroute.Route       `json:"route"`
	ConfigEntries []consulapi.ConfigEntry `json:"config_entries"`
}

func runRender(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "render", `Usage: nomad-serverless render [options] file.hcl [more.hcl]

Prints, without touching the cluster, the Nomad job of each service's next revision
and the Consul route (config entries) deploy would write. Revisions are numbered
from -generation, since only the cluster knows the next one.

`)
	vars := addVarFlags(fs)
	sidecar := addSidecarFlags(fs, e.getenv)
	format := fs.String("format", "json", "json (jobs and config entries) or hcl (Nomad jobspecs a human can read)")
	generation := fs.Int("generation", 1, "the revision generation to render")
	files, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(files) == 0 || (*format != "json" && *format != "hcl") || *generation < 1 || *generation > spec.MaxGeneration {
		fs.Usage()
		return exitUsage
	}
	opts, err := sidecar.options()
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless render: %v\n", err)
		return exitUsage
	}
	parsed, ok := parseServiceFiles(e, files, vars.Options(e.getenv))
	if !ok {
		return exitError
	}
	var out []renderedService
	for _, ps := range parsed {
		svc := ps.Spec()
		rev := spec.NewRevision(svc, *generation)
		job, err := nomadjob.Compile(rev, opts)
		if err != nil {
			return errorLine(e, "render", fmt.Errorf("compile %s: %w", rev.Name(), err))
		}
		rec := consulroute.Record{Service: *svc, Latest: rev.Name(), Revisions: rollout.MergeRevisions(nil, rev.Name(), svc.Traffic)}
		route, err := rec.Route()
		if err != nil {
			return errorLine(e, "render", err)
		}
		entries, err := consulroute.ConfigEntries(rec)
		if err != nil {
			return errorLine(e, "render", fmt.Errorf("route of %s: %w", svc.Name, err))
		}
		out = append(out, renderedService{Service: svc.Name, Revision: rev.Name(), Job: job, Route: route, ConfigEntries: entries})
	}
	if *format == "hcl" {
		for i, r := range out {
			b, err := nomadjob.FormatHCL(r.Job)
			if err != nil {
				return errorLine(e, "render", err)
			}
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			fmt.Fprintf(e.stdout, "# %s: revision %s (route: %s)\n", r.Service, r.Revision, rollout.DescribeRoute(r.Route))
			_, _ = e.stdout.Write(b)
		}
		return exitOK
	}
	if err := writeJSON(e.stdout, out); err != nil {
		return errorLine(e, "render", err)
	}
	return exitOK
}
