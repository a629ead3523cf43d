package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func runStatus(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "status", `Usage: nomad-serverless status [options] <service>

Shows a service's URLs, route, and per revision the desired, running and ready
instances with the autoscaler's view (stable and panic values, last reason);
then each of its names' certificate on the gateways' HTTPS port (source, state,
issuer, expiry, renewal, last failure), and the timeline of its last wake from
zero, one line per step.

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	asJSON := fs.Bool("json", false, "print JSON")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	in, err := newInspector()
	if err != nil {
		return errorLine(e, "status", err)
	}
	states := in.AutoscalerStates(ctx, service)
	v, err := in.View(ctx, *namespace, service, states, true)
	if err != nil {
		return errorLine(e, "status", err)
	}
	if *asJSON {
		if err := writeJSON(e.stdout, explainStatus(ctx, in, v, nil)); err != nil {
			return errorLine(e, "status", err)
		}
		return exitOK
	}
	fmt.Fprintf(e.stdout, "Service:   %s (namespace %s)\n", v.Service, v.Namespace)
	if len(v.URLs) == 0 {
		fmt.Fprintln(e.stdout, "URLs:      none (no gateway is running: nomad-serverless serve)")
	} else {
		fmt.Fprintf(e.stdout, "URLs:      %s\n", strings.Join(v.URLs, "  "))
	}
	if v.Served.Internal {
		fmt.Fprintf(e.stdout, "Served:    %s\n", v.Served)
	}
	fmt.Fprintf(e.stdout, "Latest:    %s\n", orDash(v.Latest))
	fmt.Fprintf(e.stdout, "Route:     %s\n", orDash(rollout.DescribeRoute(v.Route)))
	if len(states) == 0 {
		fmt.Fprintln(e.stdout, "Autoscaler: no leader answered (is `nomad-serverless serve` running?); last reasons come from Nomad's scaling events")
	}
	fmt.Fprintln(e.stdout)
	tw := table(e.stdout)
	fmt.Fprintln(tw, "REVISION\tTRAFFIC\tDESIRED\tRUNNING\tREADY\tSTABLE\tPANIC\tMODE\tLAST REASON")
	for _, r := range v.Revisions {
		if r.Stopped {
			continue
		}
		stable, panicV, mode, reason := "-", "-", "-", r.LastScaling
		if a := r.Autoscaler; a != nil {
			stable = fmt.Sprintf("%.1f", a.Stable)
			panicV = fmt.Sprintf("%.1f", a.Panic)
			if a.Metric.Resource() {
				// A sum of percentages reads as nothing: show the
				// per-instance share of the reservation, as the
				// reason does ("cpu 85% of reserved > target 70%").
				n := float64(max(a.Actual, 1))
				stable = fmt.Sprintf("%.0f%% %s", a.Stable/n, a.Metric)
				panicV = fmt.Sprintf("%.0f%% %s", a.Panic/n, a.Metric)
			}
			mode = "stable"
			if a.PanicMode {
				mode = "panic"
			}
			reason = a.LastReason
			if reason == "" {
				reason = a.Reason
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Revision, trafficCell(r), r.Desired, r.Running, r.Ready, stable, panicV, mode, orDash(reason))
	}
	_ = tw.Flush()
	writeRollout(e.stdout, v.Rollout)
	writeCertificates(e.stdout, v.Certificates)
	writeLastWake(e.stdout, v.LastWake, in.Now())
	explainStatus(ctx, in, v, e.stdout)
	return exitOK
}

// writeCertificates prints each name's certificate: where it comes from,
// its state, issuer and expiry, and the last failure to obtain or renew
// it (on which replica, when).
func writeCertificates(w io.Writer, cs []certs.NameStatus) {
	if len(cs) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := table(w)
	fmt.Fprintln(tw, "NAME	CERTIFICATE	ISSUER	EXPIRES	RENEW BY	LAST ERROR")
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Local().Format("2006-01-02 15:04:05")
	}
	for _, c := range cs {
		state := c.State
		if c.Source != "" {
			state = string(c.Source) + ", " + c.State
		}
		last := "-"
		switch {
		case c.LastError != "":
			last = fmt.Sprintf("%s (%s, replica %s)", c.LastError, stamp(c.LastErrorAt), orDash(c.Replica))
		case c.Note != "":
			last = c.Note
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, state, orDash(c.Issuer), stamp(c.NotAfter), stamp(c.RenewBy), last)
	}
	_ = tw.Flush()
}

// writeLastWake prints the service's last wake from zero, one line per
// step in the order they happened, with the time since the held request
// and since the step before.
func writeLastWake(w io.Writer, t *spec.WakeTimeline, now time.Time) {
	fmt.Fprintln(w)
	if t == nil {
		fmt.Fprintln(w, "Last wake: none in Nomad's recent scaling events")
		return
	}
	fmt.Fprintf(w, "Last wake: %s, %s, request held by replica %s, answered by allocation %.8s\n", t.Revision, ago(now, t.Held()), orDash(t.Replica), orDash(t.Alloc))
	fmt.Fprintf(w, "  %s\n", strings.TrimPrefix(t.Summary(), "wake timeline: "))
	tw := table(w)
	fmt.Fprintln(tw, "  STEP\tSINCE REQUEST\tDELTA\tWHOSE")
	for i, st := range t.Steps {
		delta := "-"
		if i > 0 {
			delta = "+" + spec.FormatMillis(st.Delta)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", st.Step.Describe(), spec.FormatMillis(st.Since), delta, st.Step.Whose())
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// statusRolloutLines is how many of a rollout's last history lines status
// shows (status -json has them all).
const statusRolloutLines = 12

// writeRollout prints the service's latest rollout: its state, step and
// figures (the judgments' lines), and how it ended.
func writeRollout(w io.Writer, ro *consulroute.RolloutRoute) {
	if ro == nil {
		return
	}
	fmt.Fprintf(w, "\nRollout:   %s -> %s: %s", ro.Previous, ro.New, ro.Phase)
	if ro.Steps > 0 && ro.Step > 0 {
		fmt.Fprintf(w, ", step %d of %d (%d%% of the latest share; %s has %d%% of all requests)", ro.Step, ro.Steps, ro.StepPct, ro.New, ro.NewPercent)
	}
	if ro.Phase == consulroute.RolloutRolledBack {
		fmt.Fprintf(w, " (%s is marked failed)", ro.New)
	}
	fmt.Fprintln(w)
	if ro.Reason != "" {
		fmt.Fprintf(w, "  why: %s\n", ro.Reason)
	}
	h := ro.History[max(0, len(ro.History)-statusRolloutLines):]
	for _, ev := range h {
		fmt.Fprintf(w, "  %s  %s\n", ev.At.Format(time.TimeOnly), ev.Message)
	}
}
