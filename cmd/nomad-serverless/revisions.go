package main

import (
	"context"
	"fmt"
)

func runRevisions(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "revisions", `Usage: nomad-serverless revisions [options] <service>

Lists a service's revisions, newest first: instances, traffic, and whether
garbage collection keeps each one and why.

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	asJSON := fs.Bool("json", false, "print JSON")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	in, err := newInspector()
	if err != nil {
		return errorLine(e, "revisions", err)
	}
	v, err := in.View(ctx, *namespace, service, nil, false)
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\n", r.Revision, r.Generation, ago(in.Now(), r.Created), inst, r.Ready, trafficCell(r), kept)
	}
	_ = tw.Flush()
	return exitOK
}
