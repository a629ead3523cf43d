package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// devRevisionSource is what dev -deploy reads of Nomad to see the revision
// scale to zero (nomadjob.Client).
type devRevisionSource interface {
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
}

// devHooks are what dev calls out to; tests replace them (the real deploy
// and Nomad need real agents, which e2e has).
type devHooks struct {
	// deploy runs `deploy` in process.
	deploy func(ctx context.Context, e *env, args []string) int
	// revisions returns a Nomad reader; it is called after the process
	// environment points at the dev agents.
	revisions func() (devRevisionSource, error)
	// demo runs the demonstration (-or-demo without the agents).
	demo func(ctx context.Context, e *env, c devConfig) int
}

func (h devHooks) withDefaults() devHooks {
	if h.deploy == nil {
		h.deploy = runDeploy
	}
	if h.revisions == nil {
		h.revisions = func() (devRevisionSource, error) { return newNomad() }
	}
	if h.demo == nil {
		h.demo = runDevDemo
	}
	return h
}

// devDeclaresVar reports whether a service file declares variable name, so
// dev passes -var only to files that take it (deploy warns about others).
func devDeclaresVar(path, name string) bool {
	src, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return false
	}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if b.Type == "variable" && len(b.Labels) == 1 && b.Labels[0] == name {
			return true
		}
	}
	return false
}

// devDeploy is what -deploy does once the agents and serve run: deploy the
// file with the real deploy command, print the URL, send a request through
// the gateway, wait (bounded) for the revision to scale to zero, and wake it
// with a second request, timing its first byte.
func devDeploy(ctx context.Context, e *env, c devConfig, h devHooks, a *devagents.Agents) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: "+format+"\n", args...)
		return exitError
	}
	// deploy and the Nomad reader below use this process's environment;
	// dev owns its process, so changing it affects no one else.
	if err := devagents.PointProcessAt(a.NomadAddr, a.ConsulAddr); err != nil {
		return fail("point this process at the dev agents: %v", err)
	}
	args := []string{"-sidecar-command", c.Executable}
	vars := map[string]string{}
	if devDeclaresVar(c.Deploy, "binary") {
		args = append(args, "-var", "binary="+c.Executable)
		vars["binary"] = c.Executable
	}
	args = append(args, c.Deploy)
	fmt.Fprintf(e.stdout, "Deploying %s:\n  $ nomad-serverless deploy %s\n", c.Deploy, strings.Join(args, " "))
	indented := &env{stdout: &devPrefixWriter{prefix: "  ", w: e.stdout}, stderr: &devPrefixWriter{prefix: "  ", w: e.stderr}, getenv: func(k string) string {
		// -sidecar-command is given; a cluster-wide sidecar image or
		// artifact of the user's would make it two ways at once.
		if strings.HasPrefix(k, "NOMAD_SERVERLESS_SIDECAR_") {
			return ""
		}
		return e.getenv(k)
	}}
	if code := h.deploy(ctx, indented, args); code != exitOK {
		if ctx.Err() != nil {
			return devInterrupted(ctx, e, ctx.Err())
		}
		return fail("deploy of %s failed (exit %d; its messages are above, serve's are prefixed 'serve |'); stopping everything.", c.Deploy, code)
	}

	// The file parsed for deploy; it parses here too, for the service to
	// call.
	f, diags := svchcl.ParseFile(c.Deploy, svchcl.Options{Vars: vars, Getenv: e.getenv})
	if diags.HasErrors() || len(f.Services) == 0 {
		return fail("read %s after deploying it: %v", c.Deploy, diags)
	}
	svc := f.Services[0]
	if len(f.Services) > 1 {
		fmt.Fprintf(e.stdout, "\n%s declares %d services; the requests below go to the first, %s.\n", c.Deploy, len(f.Services), svc.Name)
	}
	host := svc.Name + "." + svc.Namespace + "." + c.Domain
	gw := "http://" + devDialAddr(c.Listen)
	fmt.Fprintf(e.stdout, "\n%s is at http://%s/\n  $ curl -H 'Host: %s' %s/\n", svc.Name, host, host, gw)

	r := devRequest(ctx, gw+"/", host)
	fmt.Fprintf(e.stdout, "Request through the gateway: %s\n", r)
	if !r.ok() {
		return fail("the first request to %s failed; stopping everything.", svc.Name)
	}

	if svc.Scaling.Min > 0 {
		fmt.Fprintf(e.stdout, "\n%s keeps at least %d instance(s) (scaling.min), so it never scales to zero: nothing to wake.\n", svc.Name, svc.Scaling.Min)
		return devStillRunning(e.stdout, host, gw)
	}
	nomad, err := h.revisions()
	if err != nil {
		return fail("%v", err)
	}
	bound := c.ZeroWait
	if bound <= 0 {
		bound = svc.Scaling.Window + svc.Scaling.ScaleToZeroGrace + time.Minute
	}
	rev, took, err := devWaitZero(ctx, e.stdout, nomad, svc, bound, c.Poll)
	if err != nil {
		if ctx.Err() != nil {
			return devInterrupted(ctx, e, err)
		}
		return fail("%v; stopping everything.", err)
	}
	fmt.Fprintf(e.stdout, "%s is at zero after %s without requests: no instance runs.\n", rev, took.Round(100*time.Millisecond))

	r = devRequest(ctx, gw+"/", host)
	if !r.ok() {
		fmt.Fprintf(e.stdout, "Request at zero: %s\n", r)
		return fail("the request at zero did not wake %s; stopping everything.", rev)
	}
	// To the millisecond, or the microsecond under one (a stand-in gateway
	// answers that fast; "0s" would say nothing).
	res := time.Millisecond
	if r.firstByte < time.Millisecond {
		res = time.Microsecond
	}
	fmt.Fprintf(e.stdout, "Request at zero woke it: %s; first byte after %s (scale-up call, placement, app start, readiness, proxy).\n",
		r, r.firstByte.Round(res))
	return devStillRunning(e.stdout, host, gw)
}

func devStillRunning(w io.Writer, host, gw string) int {
	fmt.Fprintf(w, "\nStill running: curl -H 'Host: %s' %s/ any time (after a few idle seconds it wakes the revision again). Ctrl-C stops everything.\n", host, gw)
	return exitOK
}

// devWaitZero waits until the service's newest revision has no desired and
// no running instance, printing each change, for at most bound.
func devWaitZero(ctx context.Context, w io.Writer, nomad devRevisionSource, svc spec.Service, bound, poll time.Duration) (string, time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	rev, last := "", ""
	var lastErr error
	for {
		revs, err := nomad.Revisions(ctx, svc.Namespace, svc.Name)
		if ctx.Err() == nil {
			// A call cut short by the bound says less than the one before.
			lastErr = err
		}
		if err == nil {
			newest := devNewest(revs)
			if newest == nil {
				lastErr = fmt.Errorf("Nomad has no revision of %s", svc.Name)
			} else {
				if rev == "" {
					rev = newest.Name
					fmt.Fprintf(w, "\nWaiting for %s to scale to zero (no requests for its %s window, then its %s grace; at most %s)...\n",
						rev, svc.Scaling.Window, svc.Scaling.ScaleToZeroGrace, bound)
				}
				state := fmt.Sprintf("%d desired, %d running", newest.Desired, newest.Running+newest.Starting)
				if state != last {
					fmt.Fprintf(w, "  %s: %s (%s)\n", newest.Name, state, time.Since(start).Round(100*time.Millisecond))
					last = state
				}
				if newest.Desired == 0 && newest.Running == 0 && newest.Starting == 0 {
					return newest.Name, time.Since(start), nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if rev == "" {
				rev = svc.Name
			}
			why := "last seen: " + last
			if lastErr != nil {
				why = "last error: " + lastErr.Error()
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return rev, 0, fmt.Errorf("%s did not scale to zero within %s (%s); see `nomad job scaling-events %s` and serve's log", rev, bound, why, rev)
			}
			return rev, 0, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// devNewest is the revision with the highest generation that is not
// stopped.
func devNewest(revs []nomadjob.RevisionStatus) *nomadjob.RevisionStatus {
	var out *nomadjob.RevisionStatus
	for i := range revs {
		if !revs[i].Stopped && (out == nil || revs[i].Generation > out.Generation) {
			out = &revs[i]
		}
	}
	return out
}

// devResult is one request through the gateway.
type devResult struct {
	status    string
	code      int
	firstLine string
	firstByte time.Duration
	err       error
}

func (r devResult) ok() bool { return r.err == nil && r.code >= 200 && r.code < 300 }

func (r devResult) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%s %q", r.status, r.firstLine)
}

// devRequest GETs url with a Host header and returns the status, the first
// line of the body and when its first byte came. A wake from zero holds the
// request while an instance starts, so the bound is generous.
func devRequest(ctx context.Context, url, host string) devResult {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var first time.Time
	start := time.Now()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return devResult{err: err}
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return devResult{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return devResult{err: fmt.Errorf("read the answer: %w", err)}
	}
	line, _, _ := strings.Cut(string(body), "\n")
	return devResult{status: resp.Status, code: resp.StatusCode, firstLine: strings.TrimSpace(line), firstByte: first.Sub(start)}
}

// devGetOK passes when a GET of url answers 200.
func devGetOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
