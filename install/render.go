package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Render renders the job as API JSON ({"Job": ...}, accepted by `nomad job
// run -json` and POST /v1/jobs) or, with format "hcl", as a jobspec (`nomad
// job run`), which nomadjob.FormatHCL checks holds every field of the job.
func Render(job *api.Job, format string) ([]byte, error) {
	if format == "hcl" {
		return nomadjob.FormatHCL(job)
	}
	return jobJSON(job)
}

// jobJSON marshals {"Job": job} with null fields left out, keys sorted and
// indented, so the output is stable and reads like a hand-written file.
func jobJSON(job *api.Job) ([]byte, error) {
	raw, err := json.Marshal(map[string]any{"Job": job})
	if err != nil {
		return nil, fmt.Errorf("marshal the job: %w", err)
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // keep durations (nanoseconds) exact
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("read the job back: %w", err)
	}
	b, err := json.MarshalIndent(dropNulls(v), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("indent the job: %w", err)
	}
	return append(b, '\n'), nil
}

// dropNulls removes null, "" and false members and the objects and arrays
// they leave empty. Nomad reads a missing field as null, which for these is
// the same as the value dropped (no pointer field of api.Job defaults to true
// or to a non-empty string when unset). Numbers stay: a pointer int set to 0
// (max_parallel = 0) means something else than unset.
func dropNulls(v any) any {
	switch t := v.(type) {
	case string:
		if t == "" {
			return nil
		}
		return t
	case bool:
		if !t {
			return nil
		}
		return t
	case map[string]any:
		for k, x := range t {
			x = dropNulls(x)
			if x == nil {
				delete(t, k)
				continue
			}
			t[k] = x
		}
		if len(t) == 0 {
			return nil
		}
		return t
	case []any:
		out := t[:0]
		for _, x := range t {
			if x = dropNulls(x); x != nil {
				out = append(out, x)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	default:
		return v
	}
}

// WriteFiles writes the job (jobText, rendered in format) and the policies
// into dir and returns the paths written.
func WriteFiles(dir string, o Options, format string, jobText []byte, policies []Policy) ([]string, error) {
	if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o755); err != nil {
		return nil, fmt.Errorf("write files: %w", err)
	}
	ext := ".nomad.json"
	if format == "hcl" {
		ext = ".nomad.hcl"
	}
	files := []struct {
		path string
		data []byte
	}{{filepath.Join(dir, o.JobName+ext), jobText}}
	for _, p := range policies {
		files = append(files, struct {
			path string
			data []byte
		}{filepath.Join(dir, "policies", p.File), []byte(p.Rules)})
	}
	var written []string
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			return written, fmt.Errorf("write %s: %w", f.path, err)
		}
		written = append(written, f.path)
	}
	return written, nil
}

// NextSteps tells the operator what is left: tokens into the job's Variable
// and the policies into Nomad and Consul. out is the directory WriteFiles
// wrote to, "" when the policies were not written.
func NextSteps(w io.Writer, o Options, policies []Policy, out string) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Next steps on a cluster with ACLs (see deploy/README.md):")
	for _, p := range policies {
		file := p.File
		if out != "" {
			file = filepath.Join(out, "policies", p.File)
		}
		switch {
		case p.System == "nomad" && p.Name == PolicyControlPlane && o.NomadAuth == AuthIdentity:
			fmt.Fprintf(w, "  nomad acl policy apply -namespace %s -job %s %s %s\n", o.Namespace, o.JobName, p.Name, file)
		case p.System == "nomad":
			fmt.Fprintf(w, "  nomad acl policy apply -description %q %s %s\n", p.Description, p.Name, file)
		default:
			fmt.Fprintf(w, "  consul acl policy create -name %s -description %q -rules @%s\n", p.Name, p.Description, file)
		}
	}
	var items []string
	if o.NomadAuth == AuthVariable {
		items = append(items, varNomadToken+"=<token with nomad-serverless-control-plane>")
	}
	if o.ConsulAuth == AuthVariable {
		items = append(items, varConsulToken+"=<token with nomad-serverless-control-plane>")
	}
	if o.ConsulTLS == AuthVariable {
		items = append(items, varConsulCA+"=@<Consul's CA>.pem", varConsulClientCert+"=@<client certificate>.pem", varConsulClientKey+"=@<its key>.pem")
	}
	if len(items) > 0 {
		fmt.Fprintf(w, "  nomad var put -namespace %s %s %s\n", o.Namespace, o.variablePath(), strings.Join(items, " "))
	}
}
