package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/rollout"
)

func runDeploy(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "deploy", `Usage: nomad-serverless deploy [options] file.hcl [more.hcl]

Makes a revision of every service in the files (only when its template changed),
waits until it is ready, then routes its traffic. Nothing is submitted if any
service is invalid.

`)
	vars := addVarFlags(fs)
	sidecar := addSidecarFlags(fs, e.getenv)
	detach := fs.Bool("detach", false, "submit and route without waiting for the revision to be ready")
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for a new revision's instances to pass their checks")
	files, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(files) == 0 {
		fmt.Fprintln(e.stderr, "nomad-serverless deploy: name at least one service file, e.g. nomad-serverless deploy hello.hcl")
		return exitUsage
	}
	opts, err := sidecar.options()
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless deploy: %v\n", err)
		return exitUsage
	}

	parsed, ok := parseServiceFiles(e, files, vars.Options(e.getenv))
	if !ok {
		// Say it as a refused plan does: a user must not wonder whether
		// the other services of the files went out.
		fmt.Fprintln(e.stderr, "Nothing was deployed.")
		return exitError
	}
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "deploy", err)
	}
	// The control plane's tracing settings go into new revisions'
	// sidecars. Without them (an older policy that may not read the key)
	// the revisions deploy all the same, untraced.
	if opts.SidecarEnv, err = consul.TracingSettings(ctx); err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless deploy: warning: the control plane's tracing settings are not readable (%v); new revisions' sidecars will not export traces\n", err)
	}
	d, err := rollout.New(rollout.Config{
		Nomad: nomad, Consul: consul, Compile: opts,
		Out: e.stdout, Diag: e.stderr, TTY: isTerminal(e.stdout),
		Detach: *detach, Wait: *wait, Poll: 500 * time.Millisecond,
		Now: time.Now, Retain: consulroute.DefaultRetention(),
		DockerEngines: nomad.DockerEngines,
	})
	if err != nil {
		return errorLine(e, "deploy", err)
	}
	switch err := d.Deploy(ctx, parsed); {
	case err == nil:
		return exitOK
	case errors.Is(err, rollout.ErrRefused), errors.Is(err, rollout.ErrFailed), errors.Is(err, rollout.ErrInterrupted):
		return exitError // said on stderr
	default:
		return errorLine(e, "deploy", err)
	}
}

// parseServiceFiles parses every file and prints every diagnostic; ok is false
// when any file has an error or two files declare the same service.
func parseServiceFiles(e *env, files []string, opts svchcl.Options) ([]rollout.Service, bool) {
	var out []rollout.Service
	ok := true
	seen := map[string]string{}
	for _, path := range files {
		f, diags := svchcl.ParseFile(path, opts)
		if len(diags) > 0 {
			_ = f.WriteDiagnostics(e.stderr, diags)
		}
		if diags.HasErrors() {
			ok = false
			continue
		}
		for i, s := range f.Services {
			key := s.Namespace + "/" + s.Name
			if prev, dup := seen[key]; dup {
				fmt.Fprintf(e.stderr, "Error: service %q (namespace %s) is declared in both %s and %s; deploy one of them.\n", s.Name, s.Namespace, prev, path)
				ok = false
				continue
			}
			seen[key] = path
			out = append(out, rollout.Service{File: f, Index: i})
		}
	}
	if ok && len(out) == 0 {
		fmt.Fprintln(e.stderr, "Error: the files declare no service; add a service \"name\" { ... } block.")
		ok = false
	}
	return out, ok
}

// sidecarFlags are deploy's -sidecar-* flags: how the queue-proxy reaches the
// nodes. Environment variables NOMAD_SERVERLESS_SIDECAR_{IMAGE,COMMAND,ARTIFACT}
// give cluster-wide defaults.
type sidecarFlags struct {
	image, command, artifact *string
	getenv                   func(string) string
}

func addSidecarFlags(fs *flag.FlagSet, getenv func(string) string) *sidecarFlags {
	return &sidecarFlags{
		image:    fs.String("sidecar-image", "", "run the queue-proxy from this docker `image` (its entrypoint is nomad-serverless); env NOMAD_SERVERLESS_SIDECAR_IMAGE"),
		command:  fs.String("sidecar-command", "", "run the queue-proxy with raw_exec from this absolute `path` on every node; env NOMAD_SERVERLESS_SIDECAR_COMMAND (default: this binary, for local dev clusters)"),
		artifact: fs.String("sidecar-artifact", "", "have Nomad download the queue-proxy binary from this `URL` (an archive holding nomad-serverless); env NOMAD_SERVERLESS_SIDECAR_ARTIFACT"),
		getenv:   getenv,
	}
}

func (s *sidecarFlags) options() (nomadjob.Options, error) {
	pick := func(flagVal *string, envName string) string {
		if *flagVal != "" {
			return *flagVal
		}
		return s.getenv(envName)
	}
	opts := nomadjob.Options{Sidecar: nomadjob.SidecarOptions{
		Image:       pick(s.image, "NOMAD_SERVERLESS_SIDECAR_IMAGE"),
		Command:     pick(s.command, "NOMAD_SERVERLESS_SIDECAR_COMMAND"),
		ArtifactURL: pick(s.artifact, "NOMAD_SERVERLESS_SIDECAR_ARTIFACT"),
	}}
	set := 0
	for _, v := range []string{opts.Sidecar.Image, opts.Sidecar.Command, opts.Sidecar.ArtifactURL} {
		if v != "" {
			set++
		}
	}
	if set > 1 {
		return opts, errors.New("give only one of -sidecar-image, -sidecar-command and -sidecar-artifact")
	}
	if set == 0 {
		exe, err := os.Executable()
		if err != nil {
			return opts, fmt.Errorf("find this binary for the sidecar (give -sidecar-command, -sidecar-image or -sidecar-artifact): %w", err)
		}
		opts.Sidecar.Command = exe
	}
	return opts, nil
}
