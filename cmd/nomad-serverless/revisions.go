package main

import (
	"context"
	"flag"
	"fmt"
)

func runRevisions(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("revisions", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintln(e.stderr, "Usage: nomad-serverless revisions [options] <service>")
		fmt.Fprintln(e.stderr, "\nLists a service's revisions, newest first: instances, traffic, and whether")
		fmt.Fprintln(e.stderr, "garbage collection keeps each one and why.")
		fmt.Fprintln(e.stderr)
		fs.PrintDefaults()
	}
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	asJSON := fs.Bool("json", false, "print JSON")
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 1 {
		fs.Usage()
		return exitUsage
	}
	in, err := newInspector()
	if err != nil {
		return errorLine(e, "revisions", err)
	}
	v, err := in.view(ctx, *namespace, rest[0], nil, false)
	if err != nil {
		return errorLine(e, "revisions", err)
	}
	if *asJSON {
		if err := writeJSON(e.stdout, v.Revisions); err != nil {
			return errorLine(e, "revisions", err)
		}
		return exitOK
	}
	tw := table(e.stdout)
	fmt.Fprintln(tw, "REVISION\tGENERATION\tCREATED\tINSTANCES\tREADY\tTRAFFIC\tRETAINED")
	for _, r := range v.Revisions {
		kept := "yes: " + r.Why
		if !r.Retained {
			kept = "no: " + r.Why
		}
		if r.Why == "" {
			kept = "yes"
		}
		inst := fmt.Sprintf("%d/%d", r.Running, r.Desired)
		if r.Stopped {
			inst = "stopped"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\n", r.Revision, r.Generation, ago(in.now, r.Created), inst, r.Ready, trafficCell(r), kept)
	}
	_ = tw.Flush()
	return exitOK
}
