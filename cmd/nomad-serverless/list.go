package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

// listRow is one service as `list` shows it.
type listRow struct {
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	URL       string `json:"url,omitempty"`
	// Internal: the URL answers on the gateways' internal listener only.
	Internal  bool     `json:"internal,omitempty"`
	Latest    string   `json:"latest"`
	Traffic   string   `json:"traffic"`
	Revisions int      `json:"revisions"`
	Running   int      `json:"running"`
	Desired   int      `json:"desired"`
	Problems  []string `json:"problems,omitempty"`
}

func runList(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "list", `Usage: nomad-serverless list [-json]

Lists every service: URL (marked internal when it answers on the gateways'
internal listener only), latest revision, traffic and instances.

`)
	asJSON := fs.Bool("json", false, "print JSON")
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 0 {
		fs.Usage()
		return exitUsage
	}
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "list", err)
	}
	recs, err := consul.Records(ctx)
	if err != nil {
		return errorLine(e, "list", err)
	}
	revs, err := nomad.AllRevisionCounts(ctx)
	if err != nil {
		return errorLine(e, "list", err)
	}
	gws, _ := consul.Gateways(ctx)

	rows := map[string]*listRow{}
	key := func(ns, svc string) string { return ns + "/" + svc }
	for _, rec := range recs {
		r := &listRow{Service: rec.Service.Name, Namespace: rec.Namespace(), Latest: rec.Latest, Traffic: rollout.DescribeTraffic(rec),
			Internal: rec.Service.Internal()}
		if len(gws) > 0 {
			r.URL = fmt.Sprintf("http://%s.%s.%s/", r.Service, r.Namespace, gws[0].Domain)
		}
		rows[key(r.Namespace, r.Service)] = r
	}
	for _, rv := range revs {
		k := key(rv.Namespace, rv.Service)
		r, ok := rows[k]
		if !ok {
			r = &listRow{Service: rv.Service, Namespace: rv.Namespace, Traffic: "-",
				Problems: []string{"no route in Consul (deploy again, or delete it)"}}
			rows[k] = r
		}
		if rv.Stopped {
			continue
		}
		r.Revisions++
		r.Running += rv.Running
		r.Desired += rv.Desired
	}
	out := make([]listRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		return key(out[i].Namespace, out[i].Service) < key(out[j].Namespace, out[j].Service)
	})
	if *asJSON {
		if err := writeJSON(e.stdout, out); err != nil {
			return errorLine(e, "list", err)
		}
		return exitOK
	}
	if len(out) == 0 {
		fmt.Fprintln(e.stdout, "No services. Deploy one: nomad-serverless deploy examples/raw-exec.hcl")
		return exitOK
	}
	tw := table(e.stdout)
	fmt.Fprintln(tw, "SERVICE\tNAMESPACE\tURL\tLATEST\tTRAFFIC\tINSTANCES")
	for _, r := range out {
		traffic := r.Traffic
		if len(r.Problems) > 0 {
			traffic += " (" + strings.Join(r.Problems, "; ") + ")"
		}
		url := orDash(r.URL)
		if r.Internal {
			url += " (internal)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\n", r.Service, r.Namespace, url, orDash(r.Latest), traffic, r.Running, r.Desired)
	}
	_ = tw.Flush()
	return exitOK
}
