package dev

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

// RevisionSource is what dev -deploy reads of Nomad to see the revision
// scale to zero (nomadjob.Client).
type RevisionSource interface {
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
}

// declaresVar reports whether a service file declares variable name, so
// dev passes -var only to files that take it (deploy warns about others).
func declaresVar(path, name string) bool {
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

// deploy is what -deploy does once the agents and serve run: deploy the
// file with the real deploy command, print the URL, send a request through
// the gateway, wait (bounded) for the revision to scale to zero, and wake it
// with a second request, timing its first byte.
func deploy(ctx context.Context, e Env, c Config, a *devagents.Agents) error {
	fail := func(format string, args ...any) error {
		return say(e, "nomad-serverless dev: ", format, args...)
	}
	// deploy and the Nomad reader below use this process's environment;
	// dev owns its process, so changing it affects no one else.
	if err := devagents.PointProcessAt(a.NomadAddr, a.ConsulAddr); err != nil {
		return fail("point this process at the dev agents: %v", err)
	}
	args := []string{"-sidecar-command", c.Executable}
	vars := map[string]string{}
	if declaresVar(c.Deploy, "binary") {
		args = append(args, "-var", "binary="+c.Executable)
		vars["binary"] = c.Executable
	}
	args = append(args, c.Deploy)
	fmt.Fprintf(e.Stdout, "Deploying %s:\n  $ nomad-serverless deploy %s\n", c.Deploy, strings.Join(args, " "))
	indented := Env{Stdout: &prefixWriter{prefix: "  ", w: e.Stdout}, Stderr: &prefixWriter{prefix: "  ", w: e.Stderr}, Getenv: func(k string) string {
		// -sidecar-command is given; a cluster-wide sidecar image or
		// artifact of the user's would make it two ways at once.
		if strings.HasPrefix(k, "NOMAD_SERVERLESS_SIDECAR_") {
			return ""
		}
		return e.Getenv(k)
	}}
	if code := c.RunDeploy(ctx, indented, args); code != 0 {
		if ctx.Err() != nil {
			return sayInterrupted(ctx, e, ctx.Err())
		}
		return fail("deploy of %s failed (exit %d; its messages are above, serve's are prefixed 'serve |'); stopping everything.", c.Deploy, code)
	}

	// The file parsed for deploy; it parses here too, for the service to
	// call.
	f, diags := svchcl.ParseFile(c.Deploy, svchcl.Options{Vars: vars, Getenv: e.Getenv})
	if diags.HasErrors() || len(f.Services) == 0 {
		return fail("read %s after deploying it: %v", c.Deploy, diags)
	}
	svc := f.Services[0]
	if len(f.Services) > 1 {
		fmt.Fprintf(e.Stdout, "\n%s declares %d services; the requests below go to the first, %s.\n", c.Deploy, len(f.Services), svc.Name)
	}
	host := svc.Name + "." + svc.Namespace + "." + c.Domain
	gw := "http://" + dialAddr(c.Listen)
	if svc.Internal() {
		if c.InternalListen == "" {
			return fail("%s is internal (visibility = \"internal\"): it answers on serve's internal listener only, and dev runs none (-internal-listen \"\"); stopping everything.", svc.Name)
		}
		// The public port answers an internal service's names as unknown.
		gw = "http://" + dialAddr(c.InternalListen)
		fmt.Fprintf(e.Stdout, "\n%s is internal: it answers on serve's internal listener, not on the gateway's port.", svc.Name)
	}
	fmt.Fprintf(e.Stdout, "\n%s is at http://%s/\n  $ curl -H 'Host: %s' %s/\n", svc.Name, host, host, gw)

	r := request(ctx, gw+"/", host)
	fmt.Fprintf(e.Stdout, "Request through the gateway: %s\n", r)
	if !r.ok() {
		return fail("the first request to %s failed; stopping everything.", svc.Name)
	}

	if svc.Scaling.Min > 0 {
		fmt.Fprintf(e.Stdout, "\n%s keeps at least %d instance(s) (scaling.min), so it never scales to zero: nothing to wake.\n", svc.Name, svc.Scaling.Min)
		stillRunning(e.Stdout, host, gw)
		return nil
	}
	nomad, err := c.Revisions()
	if err != nil {
		return fail("%v", err)
	}
	bound := c.ZeroWait
	if bound <= 0 {
		bound = svc.Scaling.Window + svc.Scaling.ScaleToZeroGrace + time.Minute
	}
	rev, took, err := waitZero(ctx, e.Stdout, nomad, svc, bound, c.Poll)
	if err != nil {
		if ctx.Err() != nil {
			return sayInterrupted(ctx, e, err)
		}
		return fail("%v; stopping everything.", err)
	}
	fmt.Fprintf(e.Stdout, "%s is at zero after %s without requests: no instance runs.\n", rev, took.Round(100*time.Millisecond))

	r = request(ctx, gw+"/", host)
	if !r.ok() {
		fmt.Fprintf(e.Stdout, "Request at zero: %s\n", r)
		return fail("the request at zero did not wake %s; stopping everything.", rev)
	}
	// To the millisecond, or the microsecond under one (a stand-in gateway
	// answers that fast; "0s" would say nothing).
	res := time.Millisecond
	if r.firstByte < time.Millisecond {
		res = time.Microsecond
	}
	fmt.Fprintf(e.Stdout, "Request at zero woke it: %s; first byte after %s (scale-up call, placement, app start, readiness, proxy).\n",
		r, r.firstByte.Round(res))
	stillRunning(e.Stdout, host, gw)
	return nil
}

func stillRunning(w io.Writer, host, gw string) {
	fmt.Fprintf(w, "\nStill running: curl -H 'Host: %s' %s/ any time (after a few idle seconds it wakes the revision again). Ctrl-C stops everything.\n", host, gw)
}

// waitZero waits until the service's newest revision has no desired and
// no running instance, printing each change, for at most bound.
func waitZero(ctx context.Context, w io.Writer, nomad RevisionSource, svc spec.Service, bound, poll time.Duration) (string, time.Duration, error) {
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
			newest := newestRevision(revs)
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

// newestRevision is the revision with the highest generation that is not
// stopped.
func newestRevision(revs []nomadjob.RevisionStatus) *nomadjob.RevisionStatus {
	var out *nomadjob.RevisionStatus
	for i := range revs {
		if !revs[i].Stopped && (out == nil || revs[i].Generation > out.Generation) {
			out = &revs[i]
		}
	}
	return out
}

// result is one request through the gateway.
type result struct {
	status    string
	code      int
	firstLine string
	firstByte time.Duration
	err       error
}

func (r result) ok() bool { return r.err == nil && r.code >= 200 && r.code < 300 }

func (r result) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%s %q", r.status, r.firstLine)
}

// request GETs url with a Host header and returns the status, the first
// line of the body and when its first byte came. A wake from zero holds the
// request while an instance starts, so the bound is generous.
func request(ctx context.Context, url, host string) result {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var first time.Time
	start := time.Now()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return result{err: err}
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return result{err: fmt.Errorf("read the answer: %w", err)}
	}
	line, _, _ := strings.Cut(string(body), "\n")
	return result{status: resp.Status, code: resp.StatusCode, firstLine: strings.TrimSpace(line), firstByte: first.Sub(start)}
}

// getOK passes when a GET of url answers 200.
func getOK(ctx context.Context, url string) error {
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
