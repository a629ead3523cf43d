package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/install"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

const installUsage = `Usage: nomad-serverless install [options]

Render the Nomad job that runs the control plane (nomad-serverless serve) on a
cluster, and the minimal Nomad and Consul ACL policies for it and for deploy
users. Prints the job; -policies-only prints the policies; -out writes all of
them as files; -apply registers the job with Nomad (NOMAD_ADDR, NOMAD_TOKEN).

Options:
`

// runInstall renders (and with -apply registers) the control plane's job.
func runInstall(ctx context.Context, e *env, args []string) int {
	o := install.Defaults()
	fs := newFlagSet(e, "install", installUsage)
	var datacenters, format, out string
	var policiesOnly, apply bool
	fs.StringVar(&o.JobName, "job", o.JobName, "Nomad job ID of the control plane")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Nomad namespace the control-plane job runs in")
	fs.StringVar(&o.ServiceNamespace, "service-namespace", o.ServiceNamespace, "Nomad namespace the deploy policy grants (\"*\" for all); the control plane's covers every namespace")
	fs.StringVar(&o.Region, "region", "", "Nomad region of the job (default: the agent's)")
	fs.StringVar(&datacenters, "datacenters", strings.Join(o.Datacenters, ","), "comma-separated datacenters the job may run in")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "number of serve replicas, spread over nodes")
	fs.StringVar(&o.Domain, "domain", o.Domain, "domain of service hosts: <service>.<namespace>.<domain>")
	fs.StringVar(&o.GatewayIP, "gateway-ip", "", "`address` the gateway (HTTP and HTTPS) binds on each node (default: every interface; ${NOMAD_IP_gateway} for the node address Nomad assigned the port)")
	fs.IntVar(&o.GatewayPort, "gateway-port", o.GatewayPort, "static port of the gateway on each node")
	fs.IntVar(&o.AdminPort, "admin-port", o.AdminPort, "static port of the admin API (health, metrics) on each node")
	fs.IntVar(&o.InternalPort, "internal-port", o.InternalPort, "static port of the gateway's internal listener on each node (0: none), bound to the node's address: internal services (visibility = \"internal\") are served there and not on the gateway's ports")
	fs.IntVar(&o.HTTPSPort, "https-port", o.HTTPSPort, "static port of the gateway's HTTPS on each node (0: none); certificates from Consul KV, and ACME with -acme-email")
	fs.StringVar(&o.ACMEEmail, "acme-email", "", "ACME account `address`: serve orders certificates for every routed name nothing else covers (agrees to the CA's terms)")
	fs.StringVar(&o.ACMEDirectory, "acme-directory", "", "ACME directory `URL` (default: serve's, Let's Encrypt)")
	fs.StringVar(&o.Image, "image", "", "Docker image of nomad-serverless (docker driver; default "+install.DefaultImage(version)+")")
	fs.StringVar(&o.Artifact, "artifact", "", "URL of a nomad-serverless binary or archive (exec driver) instead of an image")
	fs.StringVar(&o.NomadAuth, "nomad-auth", o.NomadAuth, "how serve authenticates to Nomad: identity (Nomad 1.7+ workload identity and task API socket), variable (token in the job's Nomad Variable) or none")
	fs.StringVar(&o.NomadAddr, "nomad-addr", "", "Nomad address for -nomad-auth variable or none, e.g. http://${attr.unique.network.ip-address}:4646")
	fs.StringVar(&o.ConsulAuth, "consul-auth", o.ConsulAuth, "how serve authenticates to Consul: variable (token in the job's Nomad Variable) or none")
	fs.StringVar(&o.ConsulAddr, "consul-addr", o.ConsulAddr, "Consul HTTP address as seen from the task (the node's agent); https://... for Consul's HTTPS")
	fs.StringVar(&o.ConsulTLS, "consul-tls", o.ConsulTLS, "Consul mutual TLS: variable (CA, client certificate and key as PEM in the job's Nomad Variable, items consul_ca, consul_client_cert, consul_client_key) or none")
	fs.Func("gateway-tags", "comma-separated extra Consul `tags` of the gateway service, for a catalog-driven proxy in front (e.g. urlprefix-/ for Fabio)", func(v string) error {
		for _, tag := range strings.Split(v, ",") {
			if tag = strings.TrimSpace(tag); tag != "" {
				o.GatewayTags = append(o.GatewayTags, tag)
			}
		}
		return nil
	})
	fs.IntVar(&o.CPU, "cpu", o.CPU, "CPU of each replica in MHz")
	fs.IntVar(&o.MemoryMB, "memory", o.MemoryMB, "memory of each replica in MiB")
	fs.StringVar(&format, "format", "json", "job format: json (API JSON, for nomad job run -json or curl) or hcl (a jobspec, for nomad job run)")
	fs.BoolVar(&policiesOnly, "policies-only", false, "print only the ACL policies")
	fs.StringVar(&out, "out", "", "write the job and the policies as files into this directory")
	fs.BoolVar(&apply, "apply", false, "register the job with Nomad (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE...)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless install: unexpected argument %q (install takes only options)\n", fs.Arg(0))
		return exitUsage
	}
	o.Datacenters = installSplitList(datacenters)
	if format != "json" && format != "hcl" {
		fmt.Fprintf(e.stderr, "nomad-serverless install: -format %q: want json or hcl\n", format)
		return exitUsage
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless install: %v\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return exitUsage
	}

	o.Tracing = tracing.Settings(e.getenv)
	if name := e.getenv("OTEL_SERVICE_NAME"); name != "" && len(o.Tracing) > 0 {
		o.Tracing["OTEL_SERVICE_NAME"] = name
	}
	job := install.Job(o, version)
	policies := install.Policies(o)
	jobText, err := install.Render(job, format)
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless install: render job: %v\n", err)
		return exitError
	}

	switch {
	case out != "":
		files, err := install.WriteFiles(out, o, format, jobText, policies)
		if err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless install: %v\n", err)
			return exitError
		}
		for _, f := range files {
			fmt.Fprintln(e.stdout, f)
		}
	case policiesOnly:
		for i, p := range policies {
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			fmt.Fprintf(e.stdout, "# ---- %s ACL policy %q (%s) ----\n%s", p.System, p.Name, p.File, p.Rules)
		}
	case !apply:
		e.stdout.Write(jobText)
	}

	if apply {
		if err := installApply(ctx, e, job); err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless install: %v\n", err)
			return exitError
		}
		fmt.Fprintf(e.stdout, "Registered job %s in namespace %s with %d replicas.\n", o.JobName, o.Namespace, o.Replicas)
	}
	if !policiesOnly {
		install.NextSteps(e.stderr, o, policies, out)
	}
	return exitOK
}

func installSplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// installApply registers the job with the Nomad the environment points at.
func installApply(ctx context.Context, e *env, job *api.Job) error {
	client, addr, err := installNomadClient(e.getenv)
	if err != nil {
		return err
	}
	q := (&api.WriteOptions{Namespace: *job.Namespace}).WithContext(ctx)
	resp, _, err := client.Jobs().Register(job, q)
	if err != nil {
		return fmt.Errorf("register job %s with Nomad at %s: %w (is NOMAD_ADDR right, and does NOMAD_TOKEN allow submit-job in namespace %s?)", *job.ID, addr, err, *job.Namespace)
	}
	for _, w := range strings.Split(resp.Warnings, "\n") {
		if w = strings.TrimSpace(w); w != "" {
			fmt.Fprintf(e.stderr, "Nomad warning: %s\n", w)
		}
	}
	return nil
}

// installNomadClient builds a Nomad client from the environment the way the
// nomad CLI does (api.DefaultConfig reads the NOMAD_* TLS variables), with
// the address, token, namespace and region taken from getenv so tests can run
// the command in process.
func installNomadClient(getenv func(string) string) (*api.Client, string, error) {
	cfg := api.DefaultConfig()
	if v := getenv("NOMAD_ADDR"); v != "" {
		cfg.Address = v
	}
	if v := getenv("NOMAD_TOKEN"); v != "" {
		cfg.SecretID = v
	}
	if v := getenv("NOMAD_REGION"); v != "" {
		cfg.Region = v
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, cfg.Address, fmt.Errorf("Nomad client for %s: %w", cfg.Address, err)
	}
	return client, cfg.Address, nil
}
