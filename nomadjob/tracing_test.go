package nomadjob

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The control plane's tracing settings reach the queue-proxy task's env,
// and the revision's own sidecar settings win over them.
func TestSidecarEnvCarriesTracingSettings(t *testing.T) {
	opts := testOptions()
	opts.SidecarEnv = map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
		"OTEL_TRACES_SAMPLER_ARG":     "0.01",
		spec.EnvSidecarRevision:       "not-this-one",
	}
	rev, job := mustCompile(t, rawExecBinary(), 1, opts)
	env := taskByName(t, job.TaskGroups[0], spec.SidecarTaskName).Env
	if env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://collector:4318" || env["OTEL_TRACES_SAMPLER_ARG"] != "0.01" {
		t.Errorf("sidecar env %v lacks the tracing settings", env)
	}
	if env[spec.EnvSidecarRevision] != rev.Name() {
		t.Errorf("the revision's own setting was overridden: %s = %q", spec.EnvSidecarRevision, env[spec.EnvSidecarRevision])
	}
	if user := taskByName(t, job.TaskGroups[0], spec.UserTaskName).Env; user["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" {
		t.Errorf("the app got the control plane's tracing settings: %v", user)
	}
}
