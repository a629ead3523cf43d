package tracing

import (
	"os"
	"sort"
	"strings"
)

// Enabled reports whether the environment (getenv) names an OTLP
// endpoint for traces and does not switch the traces exporter off:
// without one nothing is exported, so nothing is traced.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") ||
		strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Variables are the OTEL_* variables that configure tracing and are
// passed on to the processes the control plane starts (serve in the
// control plane's job, the revisions' sidecars). OTEL_SERVICE_NAME is not
// among them: each process names itself.
var Variables = []string{
	"OTEL_SDK_DISABLED",
	"OTEL_TRACES_EXPORTER",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
	"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
	"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	"OTEL_RESOURCE_ATTRIBUTES",
}

// Settings are the Variables set in the environment (getenv), to pass
// on; empty when tracing is off.
func Settings(getenv func(string) string) map[string]string {
	out := map[string]string{}
	if !Enabled(getenv) {
		return out
	}
	for _, k := range Variables {
		if v := getenv(k); v != "" {
			out[k] = v
		}
	}
	return out
}

// ProcessSettings is Settings of this process's environment.
func ProcessSettings() map[string]string { return Settings(os.Getenv) }

// SortedKeys lists a settings map's keys in order, for stable output.
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
